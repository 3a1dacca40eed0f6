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

from harness.results.rows import error_type

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
    how: str = "run"  # "run": the run's own cells pin it; "extra cells": harness locate's cells did

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


def error_class(row: Mapping[str, object]) -> str:
    """The exception type of an errored row, from its traceback's last line (``IndexError``)."""
    return error_type(row.get("error")) or "unknown"


def outcome(row: Mapping, name: str) -> bool | None:
    """Whether ``row`` fails failure class ``name`` (True), passes it (False), or says nothing about it (None).

    An oracle's verdict counts only on a cell that ran to the end; an error type fails on its
    own errors and passes on every cell that ran to the end.
    """
    completed = row["status"] in ("pass", "fail")
    if name.startswith("error: "):
        return True if row["status"] == "error" and error_class(row) == name[len("error: "):] else (False if completed else None)
    if not completed:
        return None
    return row["oracles"].get(name, {}).get("verdict") == "fail"


def class_masks(rows: Sequence[Mapping]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Failure class → (failing, passing) masks over ``rows``; only classes with at least one failure."""
    names = [n for n in dict.fromkeys(n for r in rows for n, v in r["oracles"].items() if v.get("verdict") == "fail")]
    names += [f"error: {kind}" for kind in sorted({error_class(r) for r in rows if r["status"] == "error"})]
    classes = {}
    for name in names:
        outcomes = [outcome(r, name) for r in rows]
        classes[name] = (np.array([o is True for o in outcomes]), np.array([o is False for o in outcomes]))
    return {name: masks for name, masks in classes.items() if masks[0].any()}


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

    def ordered(self, finding: Finding) -> Finding:
        """``finding`` with each factor's admitted levels in the order the rows first show them."""
        levels = tuple((f, tuple(sorted(ls, key=self._position(f)))) for f, ls in finding.combination.levels)
        return Finding(Combination(levels), finding.cells, finding.pinned, finding.how)

    def _position(self, factor: str):
        keys = self.keys[self.factors.index(factor)] if factor in self.factors else []
        return lambda level: keys.index(json.dumps(level)) if json.dumps(level) in keys else len(keys)

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
    """Join pinned findings on the same factors whose level tuples together fill a product:
    ``spec=draft & cache∈{host, storage}`` and ``spec=mtp & cache=host`` and ``spec=mtp & cache=storage``
    become ``spec∈{draft, mtp} & cache∈{host, storage}``; a group that fills no product stays as it is."""
    groups: dict[tuple[str, ...], list[Finding]] = {}
    for finding in findings:
        if finding.pinned:
            groups.setdefault(tuple(f for f, _ in finding.combination.levels), []).append(finding)
    merged = [f for f in findings if not f.pinned]
    for factors, group in groups.items():
        tuples = {t for f in group for t in itertools.product(*(ls for _, ls in f.combination.levels))}
        axes = [tuple(dict.fromkeys(t[i] for t in sorted(tuples, key=str))) for i in range(len(factors))]
        if len(group) > 1 and len(tuples) == len(list(itertools.product(*axes))):
            how = "extra cells" if any(f.how == "extra cells" for f in group) else "run"
            cells = list(dict.fromkeys(cell for f in group for cell in f.cells))
            merged.append(Finding(Combination(tuple(zip(factors, axes))), cells, True, how))
        else:
            merged += group
    return merged


def induced(row: Mapping, probes: Sequence[Mapping], name: str, factors: Sequence[str]) -> Combination | None:
    """The levels of ``row`` whose one-factor change (a probe of it) made failure ``name`` go away, or None."""
    cause = {p["probe"]["changed"] for p in probes if outcome(p, name) is False}
    if not cause:
        return None
    return Combination(tuple((f, (row["factors"][f],)) for f in factors if f in cause))


def _settle(cls: FailureClass, located: list[Combination], rows: Mapping[str, Mapping]) -> FailureClass:
    """Put the combinations extra cells located first; keep free findings only for the cells they leave."""
    located = [c for c in dict.fromkeys(located)
               if not any(c.matches(r["factors"]) and outcome(r, cls.name) is False for r in rows.values())]
    if not located:
        return cls
    done = [Finding(c, [cell for cell in cls.failing if c.matches(rows[cell]["factors"])], True, "extra cells")
            for c in located]
    covered = {cell for f in done for cell in f.cells}
    rest = [Finding(f.combination, [c for c in f.cells if c not in covered], f.pinned, f.how) for f in cls.findings]
    findings = sorted(_merge([*done, *(f for f in rest if f.cells)]), key=_rank)
    return FailureClass(cls.name, cls.failing, cls.passing, findings, [c for c in cls.unexplained if c not in covered])


def analyze(rows: Sequence[Mapping], probes: Sequence[Mapping] = (), max_size: int = MAX_SIZE) -> list[FailureClass]:
    """Every failure class of ``rows`` (and of ``harness locate``'s extra cells) with its ranked findings."""
    ids = {r["cell_id"] for r in rows}
    rows = [*rows, *(p for p in probes if p["cell_id"] not in ids)]
    if not rows:
        return []
    levels = _Levels(rows)
    by_id = {r["cell_id"]: r for r in rows}
    probes_of: dict[str, list[Mapping]] = {}
    for probe in probes:
        probes_of.setdefault(probe.get("probe", {}).get("of"), []).append(probe)
    classes = []
    for name, (failing, passing) in class_masks(rows).items():
        cls = _free(levels, rows, name, failing, passing, max_size)
        located = [induced(by_id[cell], probes_of[cell], name, levels.factors) for cell in cls.failing if cell in probes_of]
        cls = _settle(cls, [c for c in located if c is not None], by_id)
        cls.findings = [levels.ordered(f) for f in cls.findings]
        classes.append(cls)
    return sorted(classes, key=lambda c: (-len(c.failing), c.name))


def _free(levels: _Levels, rows: Sequence[Mapping], name: str, failing: np.ndarray, passing: np.ndarray,
          max_size: int) -> FailureClass:
    """The free step: minimal candidates from the cells alone, ranked (pinned, more cells, fewer levels first)."""
    ids = [r["cell_id"] for r in rows]
    candidates = _candidates(levels, failing, passing, max_size)
    covers = [levels.has(sorted(c)) & failing for c in candidates]
    count = np.sum(covers, axis=0) if covers else np.zeros(len(rows), dtype=int)
    findings = [Finding(levels.combination(sorted(c)), [ids[i] for i in np.flatnonzero(cover)],
                        bool((count[cover] == 1).all()))
                for c, cover in zip(candidates, covers)]
    findings = sorted(_merge(findings), key=_rank)
    return FailureClass(name, [ids[i] for i in np.flatnonzero(failing)], int(passing.sum()), findings,
                        [ids[i] for i in np.flatnonzero(failing & (count == 0))])


def _rank(finding: Finding) -> tuple:
    return (not finding.pinned, -len(finding.cells), len(finding.combination.levels), finding.combination.text())
