"""What a matrix declares it knows about its engine, as the harness holds it: known failures (``[[expected]]``, with
the signature of the findings each excuses) and lossy levels' tolerances (``[[tolerances]]``), each with the cell
pattern it applies to. ``harness.matrix.declared`` reads them from the file."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType


def matches(when: Mapping[str, tuple[object, ...]], row: Mapping[str, object]) -> bool:
    """Whether ``row`` (factor → level) has one of the listed levels of every factor in ``when``."""
    return all(row[factor] in levels for factor, levels in when.items())


@dataclass(frozen=True, slots=True)
class Bound:
    """A signature's numeric range, ``{ min = A, max = B }`` (either end may be left out; both inclusive): a finding
    whose field holds a number inside it matches. For a finding told from its neighbours by size alone, e.g. a token
    divergence at a golden top-2 margin no larger than a lossy level explains (``golden_margin = { max = 0.45 }``)."""

    min: float | None = None
    max: float | None = None

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return False
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def to_json(self) -> dict:
        return {key: value for key, value in (("min", self.min), ("max", self.max)) if value is not None}


#: a signature's values for one finding field: the values that match, or the range they lie in
SignatureValues = tuple[object, ...] | Bound


@dataclass(frozen=True, slots=True)
class Expected:
    """``[[expected]]``: a declared known failure: cells matching ``when`` fail ``fails``, for ``reason``.

    ``signature`` narrows it to the findings it excuses (finding field → the values that match, e.g. ``got = 0.0``,
    or the ``Bound`` they lie in);
    without one it excuses every finding of the oracles it names. ``kind`` says what it is (an engine bug, or a
    limitation of the harness), ``upstream`` where it is reported ("unreported" where nowhere), ``seen_on`` the
    engine version it was seen on; ``cpu`` the CPU flags it needs (a bug of a kernel path the engine takes only on such
    a CPU: it applies only where the machine has every one); ``number`` is its position in the file
    (``[[expected]] #number``).
    """

    when: Mapping[str, tuple[object, ...]]
    fails: tuple[str, ...]
    reason: str
    signature: Mapping[str, SignatureValues] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    kind: str | None = None
    upstream: str | None = None
    seen_on: str | None = None
    cpu: frozenset[str] = frozenset()
    number: int = 0

    def matches(self, row: Mapping[str, object], cpu_flags: frozenset[str]) -> bool:
        """Whether it applies to a cell of levels ``row`` run on a CPU with ``cpu_flags``."""
        return matches(self.when, row) and self.cpu <= cpu_flags

    @property
    def expects_error(self) -> bool:
        """Whether it declares that the cell raises (``error: Type``): a cell that raises is judged by no oracle."""
        return any(name.startswith("error: ") for name in self.fails)

    @property
    def excused_whole(self) -> frozenset[str]:
        """The oracles whose every finding it excuses: those it names, when it has no signature (a signature leaves
        the oracle judging every finding outside it)."""
        return frozenset() if self.signature else frozenset(name for name in self.fails if not name.startswith("error: "))

    def to_json(self) -> dict:
        out = {"number": self.number, "when": {f: list(levels) for f, levels in self.when.items()},
               "fails": list(self.fails), "reason": self.reason}
        if self.signature:
            out["signature"] = {key: values.to_json() if isinstance(values, Bound) else list(values)
                                for key, values in self.signature.items()}
        return {**out, **{key: value for key, value in (("class", self.kind), ("upstream", self.upstream),
                                                        ("seen_on", self.seen_on), ("cpu", sorted(self.cpu) or None))
                          if value is not None}}


@dataclass(frozen=True, slots=True)
class Tolerance:
    """``[[tolerances]]``: a lossy level's declared tolerances: per-token logprob difference and the top-2 margin of a tie."""

    when: Mapping[str, tuple[object, ...]]
    logprobs: float | None
    tie: float | None
    reason: str

    def matches(self, row: Mapping[str, object]) -> bool:
        return matches(self.when, row)


@dataclass(frozen=True, slots=True)
class Mask:
    """Cells no oracle judges: every cell matching ``when``, excused whole by the declarations ``numbers`` together."""

    when: Mapping[str, tuple[object, ...]]
    numbers: tuple[int, ...]

    def matches(self, row: Mapping[str, object]) -> bool:
        return matches(self.when, row)


def masks(expected: Sequence[Expected], oracle_names: Collection[str]) -> tuple[Mask, ...]:
    """The cell patterns ``expected`` masks whole, ignoring ``cpu`` (a machine with the flags masks them, and the
    cells generated must not depend on the machine): each declaration that expects an error, then each smallest set
    of signature-free oracle declarations whose oracles together are every one of ``oracle_names``, on the cells
    all of them match."""
    found = [Mask(entry.when, (entry.number,)) for entry in expected if entry.expects_error]
    wholesale = [entry for entry in expected if not entry.expects_error and entry.excused_whole]
    every = frozenset(oracle_names)
    if not every <= frozenset().union(*(entry.excused_whole for entry in wholesale)):
        return tuple(found)  # no set of them excuses every oracle (the usual case: no subsets to try)
    covering: list[frozenset[int]] = []
    for size in range(1, len(wholesale) + 1):
        for group in itertools.combinations(wholesale, size):
            numbers = frozenset(entry.number for entry in group)
            if any(smaller <= numbers for smaller in covering) or not every <= frozenset().union(
                    *(entry.excused_whole for entry in group)):
                continue
            covering.append(numbers)
            when = _both(entry.when for entry in group)
            if when is not None:
                found.append(Mask(when, tuple(sorted(numbers))))
    return tuple(found)


def _both(patterns: Iterable[Mapping[str, tuple[object, ...]]]) -> dict[str, tuple[object, ...]] | None:
    """The cells every one of ``patterns`` matches, as one pattern; None when no cell does."""
    merged: dict[str, tuple[object, ...]] = {}
    for pattern in patterns:
        for factor, levels in pattern.items():
            kept = tuple(level for level in merged.get(factor, levels) if level in levels)
            if not kept:
                return None
            merged[factor] = kept
    return merged
