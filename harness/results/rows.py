"""results.jsonl rows: strict JSON out, validated JSON in, every rejected line named by file and line.

Strict JSON: ``NaN`` and ``Infinity`` are not JSON (JavaScript's ``JSON.parse`` rejects them,
jq 1.6 turns NaN into null), so a non-finite float is written as the *string* ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``. Readers that want the number back call ``as_float``.
Reading checks every row's keys and types; a line that fails is skipped and reported as a
``LineProblem`` (file, line, reason), never dropped without a word.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: a cell's status; ``xfail`` (failed as its matrix declared) and ``xpass`` (passed where a failure was declared).
STATUSES = ("pass", "fail", "error", "xfail", "xpass", "skip")
#: the statuses that fail a run: an ``xpass`` does, as pytest's ``xfail(strict=True)``; an ``xfail`` does not.
FAILING = ("fail", "error", "xpass")
VERDICTS = ("pass", "fail", "skip")
BOM = "\ufeff"
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def strict(value: object) -> object:
    """``value`` with every non-finite float as a string and tuples as lists; anything else unknown as str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if value is None or isinstance(value, (str, int)):
        return value
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        return strict(value.item())
    return str(value)


def dumps(value: object, **kwargs: object) -> str:
    """Strict JSON text of ``value`` (never NaN or Infinity literals)."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> object:
    """Parse strict JSON: ``NaN``/``Infinity`` literals are an error, as in every other JSON parser."""
    return json.loads(text, parse_constant=_reject_constant)


def as_float(value: object) -> float | None:
    """A number from a row: floats and ints as they are, the strings "NaN"/"Infinity"/"-Infinity" back as floats."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return NON_FINITE.get(value) if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class LineProblem:
    """One line of a results file that was not read as a row (or was read despite a defect)."""

    path: Path
    line: int
    reason: str
    text: str
    skipped: bool = True

    def __str__(self) -> str:
        action = "line skipped" if self.skipped else "row read anyway"
        return f"{self.path}:{self.line}: {self.reason} ({action})"


#: the keys of an oracle's finding that readers compute with (the report's token window, accept bars, tier table),
#: and what each must be; a finding may carry any other key, shown as it is.
FINDING_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "step": ((int, type(None)), "an integer or null"), "window_start": ((int,), "an integer"),
    "expected_tokens": ((list,), "a list"), "got_tokens": ((list,), "a list"),
    "histogram": ((dict,), "an object"), "expected_histogram": ((dict,), "an object"),
    "expected_tiers": ((dict,), "an object"), "got_tiers": ((dict,), "an object"),
}
#: what a factor's level may be in a row: what a matrix file's level may be.
LEVEL_TYPES = (str, int, float, bool)


def _type_problem(row: dict, key: str, kinds: tuple[type, ...], what: str) -> str | None:
    value = row[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        return f"key {key!r} must be {what}, not {type(value).__name__} {value!r:.60}"
    return None


def row_problem(row: object) -> str | None:
    """Why ``row`` is not a valid results row, or None: required keys, their types, status and verdicts."""
    if not isinstance(row, dict):
        return f"a row must be a JSON object, not {type(row).__name__}"
    required = (("cell_id", (str,), "a string"), ("factors", (dict,), "an object"), ("status", (str,), "a string"),
                ("oracles", (dict,), "an object"))
    optional = (("matrix", (str,), "a string"), ("metrics", (dict,), "an object"), ("faults", (list,), "a list"),
                ("error", (str, type(None)), "a string or null"), ("run_id", (str,), "a string"),
                ("device", (str,), "a string"), ("expected", (dict, type(None)), "an object or null"))
    for key, kinds, what in required:
        if key not in row:
            return f"missing key {key!r}"
    for key, kinds, what in required + tuple(o for o in optional if o[0] in row):
        problem = _type_problem(row, key, kinds, what)
        if problem:
            return problem
    if row["status"] not in STATUSES:
        return f"status {row['status']!r:.40} is not one of {', '.join(STATUSES)}"
    for factor, level in row["factors"].items():
        if not isinstance(level, LEVEL_TYPES):
            return f"factor {factor!r:.40}: a level is a string, number or boolean, not {type(level).__name__} {level!r:.40}"
    for name, verdict in row["oracles"].items():
        if not isinstance(verdict, dict) or verdict.get("verdict") not in VERDICTS:
            return f"oracle {name!r:.40}: needs an object with verdict in {', '.join(VERDICTS)}"
        if not isinstance(verdict.get("message", ""), str) or not isinstance(verdict.get("detail", []), list):
            return f"oracle {name!r:.40}: message must be a string and detail a list"
        excused = verdict.get("excused", {})
        if not isinstance(excused, dict) or not all(isinstance(n, int) and not isinstance(n, bool) for n in excused.values()):
            return f"oracle {name!r:.40}: excused must be an object of declaration number to count"
        for finding in verdict.get("detail", []):
            problem = _finding_problem(finding)
            if problem:
                return f"oracle {name!r:.40}: {problem}"
    if not all(isinstance(f, str) for f in row.get("faults", [])):
        return "key 'faults' must be a list of strings"
    return None


def _finding_problem(finding: object) -> str | None:
    """Why one finding of an oracle's detail cannot be read (a key of ``FINDING_KEYS`` of another type), or None."""
    if not isinstance(finding, dict):
        return None  # shown as it is
    for key, (kinds, what) in FINDING_KEYS.items():
        value = finding.get(key)
        if key in finding and (isinstance(value, bool) or not isinstance(value, kinds)):
            return f"finding key {key!r} must be {what}, not {type(value).__name__} {value!r:.40}"
    for key in ("histogram", "expected_histogram"):
        counts = finding.get(key, {})
        if any(isinstance(n, bool) or not isinstance(n, (int, float)) for n in counts.values()):
            return f"finding key {key!r} must map accept lengths to counts (numbers)"
    return None


@dataclass(slots=True)
class ReadResult:
    """The valid rows of one file (with their line numbers) and the lines that were not."""

    rows: list[dict]
    lines: list[int]
    problems: list[LineProblem]


def read_rows(path: Path, check: Callable[[object], str | None] = row_problem) -> ReadResult:
    """Read a JSON Lines file of rows; blank lines are ignored, every other bad line becomes a LineProblem."""
    result = ReadResult([], [], [])
    if not path.exists():
        return result
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith(BOM):
            result.problems.append(LineProblem(path, number, "starts with a byte-order mark (JSON Lines has none)", line, False))
            line = line[len(BOM):]
        try:
            row = loads(line)
        except ValueError as exc:
            torn = number == len(text.splitlines()) and not text.endswith("\n")
            reason = "incomplete last line (a writer was killed mid-line?)" if torn else f"not JSON: {exc}"
            result.problems.append(LineProblem(path, number, reason, line))
            continue
        problem = check(row)
        if problem:
            result.problems.append(LineProblem(path, number, problem, line))
            continue
        result.rows.append(row)
        result.lines.append(number)
    return result


def error_line(error: str | None) -> str:
    """The last non-blank line of a cell's error: a traceback's ``Type: message``; "" without an error."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def error_type(error: str | None) -> str | None:
    """The exception class a cell's traceback ends with (``IndexError`` of ``a.b.IndexError: …``), None without one."""
    head = error_line(error).split(":", 1)[0].strip()
    return head.rsplit(".", 1)[-1] or None


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_lines(path: Path, rows: Iterable[dict]) -> None:
    """Replace ``path`` with ``rows`` as strict JSON Lines, atomically."""
    write_atomic(path, "".join(dumps(r) + "\n" for r in rows))


@dataclass(slots=True)
class Verdict:
    """One oracle's judgement of one cell: ``pass``, ``fail`` or ``skip``, with its evidence."""

    oracle: str
    status: str
    message: str
    detail: list[dict] = field(default_factory=list)
    excused: dict[int, int] = field(default_factory=dict)  # [[expected]] number → the findings it excused

    def to_json(self) -> dict:
        out = {"verdict": self.status, "message": self.message, "detail": self.detail}
        return {**out, "excused": {str(number): n for number, n in self.excused.items()}} if self.excused else out


@dataclass(slots=True, kw_only=True)
class CellResult:
    """The record of one cell, as written to results.jsonl."""

    cell_id: str
    matrix: str
    factors: dict[str, object]
    status: str
    oracles: dict[str, Verdict] = field(default_factory=dict)
    metrics: dict[str, object] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    error: str | None = None
    expected: dict | None = None  # the ``[[expected]]`` entry the cell matches: when, fails, reason

    def failed(self) -> set[str]:
        """What failed: the failing oracles' names, and ``error: Type`` for a cell that raised."""
        failed = {name for name, verdict in self.oracles.items() if verdict.status == "fail"}
        return failed | ({f"error: {error_type(self.error)}"} if self.status == "error" else set())

    def settle(self) -> CellResult:
        """Judge a cell with declared known failures: ``xfail`` when what they declare occurred (findings they
        excused, or the error type they name) and nothing else failed, ``xpass`` when nothing they declare occurred
        (strict); an oracle that still fails once they excused theirs, or another error, stays ``fail``/``error``."""
        if self.expected is not None and self.status in ("pass", "fail", "error"):
            failed = self.failed()  # an oracle failing here failed on findings no declaration excused
            seen = any(verdict.excused for verdict in self.oracles.values())
            if failed and failed <= {name for name in self.expected["fails"] if name.startswith("error: ")}:
                self.status = "xfail"
            elif not failed:
                self.status = "xfail" if seen else "xpass"
        return self

    def to_json(self) -> dict:
        row = {
            "cell_id": self.cell_id, "matrix": self.matrix, "factors": self.factors, "status": self.status,
            "oracles": {name: v.to_json() for name, v in self.oracles.items()},
            "metrics": self.metrics, "faults": self.faults, "error": self.error,
        }
        return {**row, "expected": self.expected} if self.expected is not None else row
