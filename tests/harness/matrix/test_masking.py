"""Coverage net of masking: a cell ``[[expected]]`` excuses whole judges nothing, so the generator adds cells for the
tuples it alone held, keeps its own cells, and reports the tuples no judged cell can hold.

Coverage is checked by brute force over the cells' levels (``held``), never with the generator's own checker."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from harness import oracles
from harness.matrix.file import load_matrix
from harness.matrix.masking import masked_by, net_coverage
from harness.matrix.model import Cell, Matrix, generate, generate_certified

#: three factors of two levels, pairwise: four cells hold every pair, so each pair is in one cell only.
SMALL = """
[matrix]
name = "small"
mode = "t-wise"
strength = 2
workloads = ["system_prompt"]

[factors]
model = ["dense", "hybrid"]
scheduler = ["fcfs", "priority"]
page_size = [1, 16]
"""

#: masks every cell with the hybrid model under the priority scheduler: no oracle judges a cell that raises.
RAISES = """
[[expected]]
when = { model = "hybrid", scheduler = "priority" }
fails = "error: RuntimeError"
reason = "a stand-in engine bug: the hybrid model under the priority scheduler raises"
"""


def small(tmp_path: Path, declared: str = RAISES, text: str = SMALL) -> Matrix:
    path = tmp_path / "small.toml"
    path.write_text(text + declared)
    return load_matrix(str(path))


def held(cells: list[Cell], t: int) -> set[tuple[tuple[str, object], ...]]:
    """The t-tuples ``cells`` hold, by brute force."""
    return {tuple(combo) for cell in cells for combo in itertools.combinations(cell.factors, t)}


def allowed_pairs(matrix: Matrix) -> set[tuple[tuple[str, object], ...]]:
    """Every pair of the (unconstrained) product."""
    rows = [Cell(tuple(zip([f for f, _ in matrix.factors], levels)))
            for levels in itertools.product(*(levels for _, levels in matrix.factors))]
    return held(rows, 2)


def judged(matrix: Matrix, cells: list[Cell]) -> list[Cell]:
    return [cell for cell in cells if not masked_by(matrix.masks(), cell)]


def test_a_masked_cells_other_pairs_get_a_judged_cell(tmp_path: Path) -> None:
    """The masked cell (hybrid, priority, p) alone held (hybrid, p) and (priority, p): the array alone leaves them to
    a cell that judges nothing; the cells added hold them, and only the declaration's own pair stays masked."""
    matrix = small(tmp_path)
    cells, certificate = generate_certified(matrix)
    assert certificate is not None
    array = cells[:len(certificate.rows)]
    masked = [cell for cell in array if masked_by(matrix.masks(), cell)]
    assert [masked_by(matrix.masks(), cell) for cell in masked] == [(1,)]
    own = (("model", "hybrid"), ("scheduler", "priority"))
    lost = allowed_pairs(matrix) - held(judged(matrix, array), 2)
    assert len(lost) == 3 and own in lost  # without the cells added, two more pairs than the declaration's own
    assert allowed_pairs(matrix) - held(judged(matrix, cells), 2) == {own}
    added = cells[len(array):]
    assert added and not any(masked_by(matrix.masks(), cell) for cell in added)
    report = net_coverage(matrix, cells, 2)
    assert report.ok and report.masked == ((own, (1,)),) and report.masked_cells == 1
    assert report.net.covered == report.plain.required - 1 == 11
    assert not net_coverage(matrix, array, 2).ok


def test_the_arrays_own_cells_keep_their_places_and_ids(tmp_path: Path) -> None:
    """Declaring a bug appends cells; it never moves one, so earlier cell ids and frozen results keep their meaning."""
    plain = generate(small(tmp_path, declared=""))
    declared = generate(small(tmp_path))
    assert declared[:len(plain)] == plain and len(declared) > len(plain)
    assert [c.cell_id for c in generate(small(tmp_path))] == [c.cell_id for c in declared]  # deterministic


def test_a_declaration_that_leaves_an_oracle_judging_masks_nothing(tmp_path: Path) -> None:
    """Per cell: an oracle excused (or findings under a signature) leaves the other oracles judging the cell."""
    for fails in ('"completeness"', f"{list(oracles.names())}".replace("'", '"') + '\nsignature = { check = "x" }'):
        declared = RAISES.replace('"error: RuntimeError"', fails)
        matrix = small(tmp_path, declared=declared)
        assert matrix.masks() == ()
        assert generate(matrix) == generate(small(tmp_path, declared=""))
        assert net_coverage(matrix, generate(matrix), 2).masked_cells == 0


@pytest.mark.parametrize("name", ["vllm", "vllm_server", "sglang_cpu"])
def test_the_projects_declaring_matrices_are_complete_net_of_masking(name: str) -> None:
    matrix = load_matrix(name)
    report = net_coverage(matrix, generate(matrix), matrix.strength)
    assert report.plain.ok and report.ok and report.masked_cells > 0, report.gaps
