"""A matrix's cells (``harness.matrix.model``), generated from a loaded file: allowed, distinct and deterministic in
every mode; full is the product, t-wise covers every allowed t-tuple, ofat varies one factor off golden; cell ids that
``-k`` selects exactly; the golden cell, stronger groups and constraints as ``Matrix.allows`` reads them. Coverage is
checked by brute force over the full product (``every_row``), never with the generator's own checker."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from harness.matrix import model as matrix_model
from harness.matrix.model import Cell, MatrixError, Matrix
from tests.harness.matrix.test_file import STRONGER, VALID, load


def every_row(matrix: Matrix) -> list[dict[str, object]]:
    """The full product of the matrix's levels, as rows, independently of ``generate``."""
    names = [factor for factor, _ in matrix.factors]
    return [dict(zip(names, levels)) for levels in itertools.product(*(lv for _, lv in matrix.factors))]


@pytest.mark.parametrize("mode", ["full", "t-wise", "ofat"])
def test_generated_cells_are_allowed_distinct_and_deterministic(tmp_path: Path, mode: str) -> None:
    matrix = load(tmp_path) if mode == "t-wise" else load(tmp_path, mode=mode)
    cells = matrix_model.generate(matrix)
    assert cells, "a matrix with allowed rows has cells"
    forbidden = [c.cell_id for c in cells if c.level("cache") == "off" and c.level("scheduler") == "priority"]
    assert not forbidden
    assert len({c.cell_id for c in cells}) == len(cells) == len(set(cells))
    again = matrix_model.generate(load(tmp_path) if mode == "t-wise" else load(tmp_path, mode=mode))
    assert [c.cell_id for c in again] == [c.cell_id for c in cells]


def test_full_is_the_product_minus_forbidden_in_file_order(tmp_path: Path) -> None:
    matrix = load(tmp_path, mode="full")
    expected = [row for row in every_row(matrix)
                if not (row["cache"] == "off" and row["scheduler"] == "priority")]
    assert [c.as_dict() for c in matrix_model.generate(matrix)] == expected
    assert len(expected) == 12


def test_t_wise_covers_every_allowed_pair(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    cells = matrix_model.generate(matrix)
    allowed = [row for row in every_row(matrix) if matrix.allows(row)]
    needed = {(a, row[a], b, row[b]) for row in allowed for a, b in itertools.combinations(row, 2)}
    seen = {(a, c.level(a), b, c.level(b)) for c in cells for a, b in itertools.combinations(c.as_dict(), 2)}
    assert needed <= seen
    assert matrix_model.lower_bound(matrix, 2) == 4
    four_suffice = any(needed <= {(a, r[a], b, r[b]) for r in rows for a, b in itertools.combinations(r, 2)}
                       for rows in itertools.combinations(allowed, 4))
    assert not four_suffice and len(cells) == 5, "the constraint makes 5 the minimum"
    report = matrix_model.coverage(matrix, cells, 2)
    assert (report.ok, report.required, report.covered) == (True, len(needed), len(needed))


def test_coverage_reports_what_a_dropped_cell_held(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    cells = matrix_model.generate(matrix)
    report = matrix_model.coverage(matrix, cells[1:], 2)
    assert not report.ok and report.covered == report.required - len(report.missing)
    assert all(cells[0].level(f) == level for ttuple in report.missing for f, level in ttuple)


def test_ofat_varies_one_factor_from_the_golden_cell(tmp_path: Path) -> None:
    cells = matrix_model.generate(load(tmp_path, mode="ofat"))
    assert [c.cell_id for c in cells] == [
        "/model:dense/cache:off/scheduler:fcfs/page_size:1/",
        "/model:hybrid/cache:off/scheduler:fcfs/page_size:1/",
        "/model:dense/cache:device/scheduler:fcfs/page_size:1/",
        # scheduler:priority with cache:off is forbidden, so OFAT never tries priority
        "/model:dense/cache:off/scheduler:fcfs/page_size:16/",
    ]


def test_with_strength_turns_any_matrix_t_wise(tmp_path: Path) -> None:
    matrix = load(tmp_path, mode="full").with_strength(3)
    assert (matrix.mode, matrix.strength) == ("t-wise", 3)
    assert matrix_model.coverage(matrix, matrix_model.generate(matrix), 3).ok
    with pytest.raises(MatrixError, match=r"smoke\.toml: --strength: 5 is out of range 1\.\.4"):
        matrix.with_strength(5)


def test_cell_id_is_readable_and_selectable_with_k() -> None:
    cell = Cell((("model", "dense"), ("cache", "mypkg.store:MyCache"), ("page_size", 16)))
    assert cell.cell_id == "/model:dense/cache:MyCache/page_size:16/"
    assert Expression.compile(cell.cell_id).evaluate(lambda name, **_: name in f"test[{cell.cell_id}]")
    assert cell.level("page_size") == 16 and cell.as_dict()["cache"] == "mypkg.store:MyCache"
    with pytest.raises(KeyError, match="'pool'"):
        cell.level("pool")


#: three ids where one level is a prefix of another (1, 16) and one factor name ends another (tp, decode_tp).
K_CELLS = [Cell((("decode_tp", 2), ("tp", tp), ("page_size", page))) for tp, page in ((1, 1), (2, 16), (1, 16))]


@pytest.mark.parametrize(("expression", "expected"), [
    ("/page_size:1/", [0]),  # never page_size:16
    ("/page_size:16/", [1, 2]),
    ("/tp:2/", [1]),  # /decode_tp:2/ is in every id, yet never matches
    ("/tp:1/ and not /page_size:16/", [0]),
    ("page_size:1", [0, 1, 2]),  # without the delimiters, the prefix match pytest does
])
def test_a_delimited_pair_in_k_selects_exactly_its_level(expression: str, expected: list[int]) -> None:
    """pytest -k matches substrings of the item name, case-insensitively; the ``/`` on both sides end that."""
    def selected(cell: Cell) -> bool:
        return Expression.compile(expression).evaluate(lambda sub, **_: sub.lower() in cell.cell_id.lower())

    assert [i for i, cell in enumerate(K_CELLS) if selected(cell)] == expected


def test_golden_of_replaces_only_factors_with_a_golden_level(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    cell = Cell((("model", "hybrid"), ("cache", "device"), ("scheduler", "priority"), ("page_size", 16)))
    assert matrix.golden_of(cell) == Cell(
        (("model", "hybrid"), ("cache", "off"), ("scheduler", "fcfs"), ("page_size", 1)))
    assert matrix.golden["pool"] == "static" and matrix.golden["backend"] == "torch"


def test_stronger_group_is_covered_at_its_strength(tmp_path: Path) -> None:
    """Every allowed triple of cache × scheduler × page_size runs, and every pair of the rest."""
    matrix = load(tmp_path, VALID + STRONGER)
    assert matrix.stronger == ((("cache", "scheduler", "page_size"), 3),)
    cells = matrix_model.generate(matrix)
    allowed = [row for row in every_row(matrix) if matrix.allows(row)]
    group = ("cache", "scheduler", "page_size")
    assert {tuple(row[f] for f in group) for row in allowed} <= {tuple(c.level(f) for f in group) for c in cells}
    report = matrix_model.coverage(matrix, cells, 2)
    assert report.ok and report.required > matrix_model.coverage(load(tmp_path), cells, 2).required
    assert matrix_model.lower_bound(matrix, 2) == 6  # the group's allowed triples: 8 minus the 2 forbidden ones


def test_constraint_semantics_match_allows(tmp_path: Path) -> None:
    """The index predicate the t-wise generator uses agrees with ``Matrix.allows`` on every row."""
    text = VALID.replace("# END", '[[constraints]]\nforbid = { model = "hybrid", page_size = [1, 16], '
                                   'cache = "device" }\nreason = "example"\n')
    matrix = load(tmp_path, text, mode="full")
    full = matrix_model.generate(matrix)
    assert len(full) == sum(matrix.allows(row) for row in every_row(matrix)) == 16 - 4 - 4
    assert matrix_model.generate(matrix.with_strength(4)) == full, "at t = #factors every allowed row is needed"
    for t in (1, 2, 3, 4):
        cells = matrix_model.generate(matrix.with_strength(t))
        assert all(matrix.allows(c.as_dict()) for c in cells)
        assert matrix_model.coverage(matrix, cells, t).ok


def test_coverage_and_lower_bound_check_the_strength(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    for bad in (0, 5):
        with pytest.raises(MatrixError, match=rf"smoke\.toml: t: {bad} is out of range"):
            matrix_model.coverage(matrix, [], bad)
        with pytest.raises(MatrixError, match=rf"smoke\.toml: t: {bad} is out of range"):
            matrix_model.lower_bound(matrix, bad)
