"""Locate: the smallest factor-level combinations that explain each oracle's (or error type's) failures.

A combination explains failures when every cell that has it failed and no cell that passed
has it (cells that errored are neither, for an oracle). Among the combinations of up to
``max_size`` levels found in failing cells, the minimal ones (no smaller one also qualifies)
are the candidates. A failing cell with exactly one candidate is *pinned*: with a deterministic
fault that needs at most ``max_size`` factors, that combination is the cause. Cells with several
candidates need the extra cells ``harness locate`` runs (one factor changed at a time); their
rows simply join the analysis. This is the classic free step of fault localisation on covering
arrays (FIELD-NOTES: "Locating the failure-inducing combination").
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAX_SIZE = 3


@dataclass(frozen=True, slots=True)
class Combination:
    """Factor → admitted levels, in factor order: ``spec∈{draft, mtp} & cache=device``."""

    levels: tuple[tuple[str, tuple[object, ...]], ...]

    def text(self) -> str:
        def one(factor: str, levels: tuple[object, ...]) -> str:
            return f"{factor}={levels[0]}" if len(levels) == 1 else f"{factor}∈{{{', '.join(map(str, levels))}}}"

        return " & ".join(one(f, ls) for f, ls in self.levels)

    def as_dict(self) -> dict[str, tuple[object, ...]]:
        return dict(self.levels)

    def matches(self, factors: Mapping[str, object]) -> bool:
        return all(factor in factors and factors[factor] in levels for factor, levels in self.levels)


@dataclass(slots=True)
class Finding:
    """One located combination of one failure class: the failing cells that have it, and whether it is pinned."""

    combination: Combination
    cells: list[str]
    pinned: bool

    @property
    def representative(self) -> str:
        return self.cells[0]


@dataclass(slots=True)
class FailureClass:
    """An oracle (or an error type) with its failing cells and the combinations that explain them, ranked."""

    name: str
    failing: list[str]
    passing: int
    findings: list[Finding]
    unexplained: list[str]

    @property
    def pinned(self) -> bool:
        """Every failing cell has exactly one candidate combination."""
        return not self.unexplained and all(f.pinned for f in self.findings)


def error_type(row: Mapping[str, object]) -> str:
    """The exception type of an errored row, from its traceback's last line (``IndexError``)."""
    lines = [line for line in str(row.get("error") or "").splitlines() if line.strip()]
    head = lines[-1].split(":", 1)[0].strip() if lines else "unknown"
    return head.rsplit(".", 1)[-1] or "unknown"


def class_masks(rows: Sequence[Mapping]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Failure class → (failing, passing) masks over ``rows``; only classes with at least one failure."""
    status = np.array([r["status"] for r in rows], dtype=object)
    completed = (status == "pass") | (status == "fail")
    classes = {}
    for name in dict.fromkeys(n for r in rows for n in r["oracles"]):
        failing = np.array([r["oracles"].get(name, {}).get("verdict") == "fail" for r in rows], dtype=bool)
        if failing.any():
            classes[name] = (failing & completed, completed & ~failing)
    for kind in sorted({error_type(r) for r in rows if r["status"] == "error"}):
        failing = np.array([r["status"] == "error" and error_type(r) == kind for r in rows], dtype=bool)
        classes[f"error: {kind}"] = (failing, completed)
    return classes


class _Levels:
    """Rows as a matrix of level indices over the factors that vary (-1 where a row lacks the factor)."""

    def __init__(self, rows: Sequence[Mapping]) -> None:
        seen: dict[str, dict[str, object]] = {}
        for row in rows:
            for factor, level in row["factors"].items():
                seen.setdefault(factor, {}).setdefault(json.dumps(level), level)
        self.factors = [f for f, levels in seen.items() if len(levels) > 1]
        self.keys = [list(seen[f]) for f in self.factors]
        self.values = [list(seen[f].values()) for f in self.factors]
        self.matrix = np.array(
            [[self.keys[i].index(json.dumps(r["factors"][f])) if f in r["factors"] else -1 for i, f in enumerate(self.factors)]
             for r in rows], dtype=np.int64).reshape(len(rows), len(self.factors))

    def combination(self, pairs: Sequence[tuple[int, int]]) -> Combination:
        return Combination(tuple((self.factors[f], (self.values[f][lv],)) for f, lv in sorted(pairs)))

    def has(self, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
        mask = np.ones(len(self.matrix), dtype=bool)
        for f, lv in pairs:
            mask &= self.matrix[:, f] == lv
        return mask


def _candidates(levels: _Levels, failing: np.ndarray, passing: np.ndarray, max_size: int) -> list[frozenset]:
    """Minimal (factor, level) sets of up to ``max_size`` pairs seen in failing rows and in no passing row."""
    found: list[frozenset] = []
    found_set: set[frozenset] = set()
    sizes = [len(k) for k in levels.keys]
    for size in range(1, min(max_size, len(levels.factors)) + 1):
        for subset in itertools.combinations(range(len(levels.factors)), size):
            cols = levels.matrix[:, subset]
            valid = (cols >= 0).all(axis=1)
            strides = np.cumprod([1] + [sizes[f] for f in subset[:-1]])
            keys = (np.where(cols >= 0, cols, 0) * strides).sum(axis=1)
            total = int(np.prod([sizes[f] for f in subset]))
            fails = np.bincount(keys[failing & valid], minlength=total)
            passes = np.bincount(keys[passing & valid], minlength=total)
            for key in np.flatnonzero((fails > 0) & (passes == 0)):
                pairs = frozenset((f, int(key // s) % sizes[f]) for f, s in zip(subset, strides))
                if not any(frozenset(sub) in found_set for n in range(1, size) for sub in itertools.combinations(pairs, n)):
                    found.append(pairs)
                    found_set.add(pairs)
    return found


def _merge(findings: list[Finding]) -> list[Finding]:
    """Join pinned findings on the same factors that differ in one factor's levels (``spec∈{draft, mtp}``)."""
    merged = True
    while merged:
        merged = False
        for a, b in itertools.combinations(findings, 2):
            la, lb = a.combination.levels, b.combination.levels
            if not (a.pinned and b.pinned) or [f for f, _ in la] != [f for f, _ in lb]:
                continue
            differ = [i for i, ((_, x), (_, y)) in enumerate(zip(la, lb)) if x != y]
            if len(differ) == 1:
                i = differ[0]
                union = tuple(dict.fromkeys(la[i][1] + lb[i][1]))
                levels = la[:i] + ((la[i][0], union),) + la[i + 1:]
                findings = [f for f in findings if f is not a and f is not b]
                findings.append(Finding(Combination(levels), list(dict.fromkeys(a.cells + b.cells)), True))
                merged = True
                break
    return findings


def analyze(rows: Sequence[Mapping], max_size: int = MAX_SIZE) -> list[FailureClass]:
    """Every failure class of ``rows`` with its ranked findings, most failing cells first."""
    if not rows:
        return []
    levels = _Levels(rows)
    ids = [r["cell_id"] for r in rows]
    classes = []
    for name, (failing, passing) in class_masks(rows).items():
        candidates = _candidates(levels, failing, passing, max_size)
        covers = [levels.has(sorted(c)) & failing for c in candidates]
        count = np.sum(covers, axis=0) if covers else np.zeros(len(rows), dtype=int)
        findings = [Finding(levels.combination(sorted(c)), [ids[i] for i in np.flatnonzero(cover)],
                            bool((count[cover] == 1).all()))
                    for c, cover in zip(candidates, covers)]
        findings = sorted(_merge(findings), key=lambda f: (not f.pinned, -len(f.cells), len(f.combination.levels),
                                                           f.combination.text()))
        classes.append(FailureClass(name, [ids[i] for i in np.flatnonzero(failing)], int(passing.sum()), findings,
                                    [ids[i] for i in np.flatnonzero(failing & (count == 0))]))
    return sorted(classes, key=lambda c: (-len(c.failing), c.name))
