"""The S3 orbit seed (three levels at strength three): every triple covered, the same rows in a fresh process, no seed
elsewhere, and fifteen such factors in 57 rows before the search. Coverage is checked by brute force
(``brute_tuples``), never with the generator's own checker."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.matrix import covering
from harness.matrix.covering import orbit
from tests.harness.matrix.covering.test_fixedsize import every_tuple
from tests.harness.matrix.covering.test_solve import brute_tuples

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize(("domains", "rows"), [([3] * 15, 57), ([3] * 12, 45), ([3] * 6 + [2] * 4, None)])
def test_the_s3_orbit_seed_covers_every_triple(domains: list[int], rows: int | None) -> None:
    """6 images of each starter row and the 3 constant rows: every 3-tuple, by brute force (3^12: the best known 45)."""
    seed = orbit.orbit_seed(domains, 3, below=70)
    assert seed is not None and (seed < np.array(domains)).all()
    assert rows is None or len(seed) == rows
    assert brute_tuples(seed.tolist(), 3) == every_tuple(domains, 3)


def test_the_s3_orbit_seed_is_the_same_in_a_fresh_process() -> None:
    code = "from harness.matrix.covering import orbit; print(orbit.orbit_seed([3] * 15, 3, 70).tolist())"
    env = {**os.environ, "PYTHONHASHSEED": "99"}
    fresh = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    assert fresh.stdout == f"{orbit.orbit_seed([3] * 15, 3, 70).tolist()}\n"


def test_the_s3_orbit_seed_is_only_for_three_levels_at_strength_three() -> None:
    assert orbit.orbit_seed([3] * 8, 2, below=100) is None
    assert orbit.orbit_seed([4] + [3] * 7, 3, below=100) is None
    assert orbit.orbit_seed([2] * 8, 3, below=100) is None


def test_fifteen_factors_of_three_levels_at_strength_three_take_57_rows_before_the_search() -> None:
    """Issue 21's space: IPOG and post-optimisation give 68, the CPHF seed 61; the S3 orbit seed 57."""
    result = covering.solve([3] * 15, 3, covering.Forbidden([3] * 15), moves=0)
    assert len(result.rows) <= 57 and "S3 orbit seed" in result.how
    assert brute_tuples(result.rows, 3) == every_tuple([3] * 15, 3)
