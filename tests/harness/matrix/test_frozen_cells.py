"""The project's matrices keep their cells: a solver or generator change that alters them is seen, not silent.

``tests/frozen_cells/NAME.cells`` holds the ordered cell ids of ``matrices/NAME.toml``. After a
deliberate change (a factor added to a matrix, a better covering array), review the diff and
regenerate every file with:

    .venv/bin/python -m tests.harness.matrix.test_frozen_cells
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.model import generate
from harness.matrix.file import load_matrix

ROOT = Path(__file__).resolve().parents[3]
MATRICES = sorted((ROOT / "matrices").glob("*.toml"))
FROZEN = Path(__file__).resolve().parents[3] / "tests" / "frozen_cells"
REGENERATE = ".venv/bin/python -m tests.harness.matrix.test_frozen_cells"


def cell_ids(matrix: Path) -> list[str]:
    """The matrix's cells, generated now, in order."""
    return [cell.cell_id for cell in generate(load_matrix(str(matrix)))]


def frozen_text(matrix: Path) -> str:
    """The frozen file for ``matrix``: a header saying how it was made, then one cell id per line."""
    loaded = load_matrix(str(matrix))
    mode = f"t-wise, t={loaded.strength}" if loaded.mode == "t-wise" else loaded.mode
    ids = cell_ids(matrix)
    header = f"# matrices/{matrix.name} ({mode}): {len(ids)} cells, in order. Regenerate: {REGENERATE}\n"
    return header + "".join(f"{cell_id}\n" for cell_id in ids)


def test_every_matrix_has_a_frozen_cell_list() -> None:
    assert sorted(p.stem for p in FROZEN.glob("*.cells")) == [m.stem for m in MATRICES], f"run {REGENERATE}"


@pytest.mark.parametrize("matrix", MATRICES, ids=[m.stem for m in MATRICES])
def test_cells_match_the_frozen_list(matrix: Path) -> None:
    frozen = FROZEN / f"{matrix.stem}.cells"
    expected = [line for line in frozen.read_text().splitlines() if not line.startswith("#")]
    assert cell_ids(matrix) == expected, f"cells of {matrix.name} changed: review, then run {REGENERATE}"


def main() -> None:
    """Rewrite every frozen list from the matrices as they generate now."""
    FROZEN.mkdir(exist_ok=True)
    for stale in set(FROZEN.glob("*.cells")) - {FROZEN / f"{m.stem}.cells" for m in MATRICES}:
        stale.unlink()
    for matrix in MATRICES:
        (FROZEN / f"{matrix.stem}.cells").write_text(frozen_text(matrix))
        print(f"{matrix.stem}: {len(cell_ids(matrix))} cells")


if __name__ == "__main__":
    main()
