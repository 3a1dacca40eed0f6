"""``[boundary]`` in a matrix file (issue 42): its keys and bounds, the cells it names, an engine that cannot say its
seams refused, and a plan that carries it only where its ``when`` matches."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.matrix.model import BoundarySettings
from harness.matrix.file import load_matrix
from harness.matrix.model import MatrixError, generate
from harness.run.plan import plan_cell
from harness.sut.base import no_seams

HEAD = """
[matrix]
name = "b"
mode = "full"
workloads = ["pair"]
{engine}

[factors]
page_size = [1, 16]
{factors}

[boundary]
{boundary}
"""


def _load(tmp_path: Path, boundary: str, engine: str = "", factors: str = ""):
    path = tmp_path / "b.toml"
    path.write_text(HEAD.format(boundary=boundary, engine=engine, factors=factors))
    return load_matrix(str(path))


def test_the_table_is_read_with_its_defaults(tmp_path: Path) -> None:
    matrix = _load(tmp_path, "draws = 5\nwhen = { page_size = 16 }")
    assert matrix.boundary == BoundarySettings(draws=5, when={"page_size": (16,)})
    plans = {cell.level("page_size"): plan_cell(matrix, cell, frozenset()) for cell in generate(matrix)}
    assert plans[1].boundary is None and plans[16].boundary == matrix.boundary


@pytest.mark.parametrize(("text", "message"), [
    ("draws = 0", "[boundary] draws: 0 is outside 1..1000"),
    ("draws = true", "[boundary] draws: expected an integer, got"),
    ("shapes = 2.5", "[boundary] shapes: expected an integer"),
    ("drawz = 3", "[boundary] drawz: unknown key"),
    ("when = { backend = \"torch\" }", "[boundary] when.backend: factor 'backend' is not in [factors]"),
    ("when = { page_size = 32 }", "[boundary] when.page_size: unknown level 32"),
])
def test_a_bad_key_is_refused_with_its_name(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MatrixError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _load(tmp_path, text)


def test_an_engine_without_seams_is_refused(tmp_path: Path) -> None:
    from harness import sut
    from harness.sut.reference import ENGINE, LEVELS

    sut.register(replace(ENGINE, levels=replace(LEVELS, name="seamless"), seams=no_seams))
    try:
        with pytest.raises(MatrixError, match="does not say its cells' seams"):
            _load(tmp_path, "draws = 2", engine='engine = "seamless"')
    finally:
        sut.unregister("seamless")
