"""The fixed-size search: it only ever shrinks a covering array and stays deterministic, and nothing it or a seed
returns (the seeds themselves: test_algebra.py, test_orbit.py) is used before the coverage check.

Coverage is checked by brute force here (``brute_tuples``), never with the generator's own checker.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from harness.matrix import covering
from harness.matrix.covering import algebra, fixedsize, orbit
from harness.matrix.covering.ipog import ipog
from harness.matrix.covering.space import TupleSpace, interactions_at, required_mask
from tests.harness.matrix.covering.test_solve import Forbid, brute_allowed_rows, brute_tuples, clauses, spaces

ROOT = Path(__file__).resolve().parents[4]


def ipog_start(domains: list[int], t: int, forbidden: covering.Forbidden) -> tuple[np.ndarray, TupleSpace, np.ndarray]:
    """IPOG's rows with no post-optimisation (a bloated start), the tuple space and its required mask."""
    space = TupleSpace(domains, interactions_at(len(domains), t))
    required = required_mask(space, forbidden)
    return ipog(domains, space.interactions, required, forbidden), space, required


@pytest.mark.parametrize(("domains", "t", "at_most"), [
    ([3] * 6, 3, 33),  # CAN(3,6,3) = 33; IPOG alone gives 48
    ([4] * 6, 2, 19),  # the best known; IPOG alone gives 28
    ([2] * 9, 4, 25),  # best known 24; IPOG alone gives 40
])
def test_fixed_size_search_reaches_near_the_best_known(domains: list[int], t: int, at_most: int) -> None:
    rows, space, required = ipog_start(domains, t, covering.Forbidden(domains))
    shrunk = fixedsize.shrink(rows, space, required, None, space.counting_bound(required), moves=20_000)
    assert len(shrunk.rows) <= at_most and not shrunk.capped
    assert brute_tuples(shrunk.rows.tolist(), t) == every_tuple(domains, t)


@settings(max_examples=30, deadline=None)
@given(spaces())
def test_fixed_size_search_keeps_coverage_and_constraints(space: tuple[list[int], int, Forbid]) -> None:
    """From IPOG's rows, under clauses: never more rows, every row allowed, every allowed tuple covered."""
    domains, t, forbidden = space
    allowed = clauses(domains, forbidden)
    rows, tuples, required = ipog_start(domains, t, allowed)
    shrunk = fixedsize.shrink(rows, tuples, required, allowed.allowed_mask, 1, moves=2_000)
    kept = [tuple(int(v) for v in row) for row in shrunk.rows]
    candidates = brute_allowed_rows(domains, allowed)
    assert len(kept) <= len(rows) and set(kept) <= set(candidates)
    assert not brute_tuples(candidates, t) - brute_tuples(kept, t)


def test_the_search_result_is_checked_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search that hands back a row too few is caught by ``solve``'s coverage check."""
    real = fixedsize.shrink

    def short(*args: object, **kwargs: object) -> fixedsize.Shrunk:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        return fixedsize.Shrunk(result.rows[1:], result.moves, result.capped)

    monkeypatch.setattr(fixedsize, "shrink", short)
    with pytest.raises(covering.CoverageError, match="misses"):
        covering.solve([3] * 6, 3, covering.Forbidden([3] * 6), method="ipog")


def test_the_wall_cap_discards_the_search_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    domains = [3] * 6
    plain = covering.solve(domains, 3, covering.Forbidden(domains), method="ipog", moves=0)
    monkeypatch.setattr(fixedsize, "WALL_CAP_S", -1.0)
    capped = covering.solve(domains, 3, covering.Forbidden(domains), method="ipog")
    assert capped.rows == plain.rows
    assert "safety net (discarded)" in capped.how


@pytest.mark.parametrize("moves", [-1, True, 2.5])
def test_a_bad_move_budget_is_refused(moves: object) -> None:
    with pytest.raises(ValueError, match="search moves must be an int >= 0"):
        covering.solve([2, 2], 2, lambda row: True, moves=moves)  # type: ignore[arg-type]


def test_same_space_same_rows_in_a_fresh_process_with_the_search_running() -> None:
    """A constrained space where the search runs (above its bound after post-optimisation): a fresh interpreter with
    another hash seed gives the same rows and the same certificate."""
    domains, clause = [3, 3, 3, 3, 3, 3, 2], "{0: [1], 5: [1]}"
    code = ("from harness.matrix import covering; "
            f"r = covering.solve({domains}, 3, covering.Forbidden({domains}, [{clause}]), method='ipog'); "
            "print(r.rows, r.how)")
    env = {**os.environ, "PYTHONHASHSEED": "777"}
    fresh = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    here = covering.solve(domains, 3, covering.Forbidden(domains, [{0: [1], 5: [1]}]), method="ipog")
    assert "fixed-size search" in here.how
    assert fresh.stdout == f"{here.rows} {here.how}\n"


def test_harness_list_prints_the_same_cells_on_every_run() -> None:
    """The same matrix file, listed by two fresh processes with different hash seeds: the same ids in the same order,
    and the same certificate (vllm's search runs: 30 cells against a bound of 20)."""
    outputs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outputs.append(subprocess.run([sys.executable, "-m", "harness", "list", "--matrix", "vllm"], cwd=ROOT,
                                      capture_output=True, text=True, check=True, env=env).stdout)
    assert outputs[0] == outputs[1]
    assert "fixed-size search" in outputs[0]


def every_tuple(domains: Sequence[int], t: int) -> set[tuple[tuple[int, int], ...]]:
    """Every t-tuple of an unconstrained space, built directly (no product of the domains)."""
    return {tuple(zip(combo, levels)) for combo in itertools.combinations(range(len(domains)), t)
            for levels in itertools.product(*(range(domains[f]) for f in combo))}


@pytest.mark.parametrize(("module", "builder", "domains", "named"), [
    (algebra, "cphf_seed", [3] * 4, "CPHF"), (orbit, "orbit_seed", [3] * 5, "S3 orbit")])
def test_a_seed_that_misses_a_tuple_is_never_used(monkeypatch: pytest.MonkeyPatch, module, builder: str,
                                                  domains: list[int], named: str) -> None:
    """A seed with a row taken out is fewer rows than IPOG's, and wrong: ``solve`` keeps its own."""
    broken = getattr(module, builder)(domains, 3, below=10 ** 6)[1:]
    monkeypatch.setattr(module, builder, lambda domains, t, below: broken)
    result = covering.solve(domains, 3, covering.Forbidden(domains), method="ipog")
    assert named not in result.how
    assert brute_tuples(result.rows, 3) == every_tuple(domains, 3)
