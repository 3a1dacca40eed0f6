"""``harness list`` shows coverage net of masking beside the plain one: counts, and the tuples only masked cells
hold, under the ``[[expected]]`` entries that mask them."""
from __future__ import annotations

from pathlib import Path

from harness.cli.main import main
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from tests.harness.matrix.test_masking import RAISES, SMALL


def test_list_shows_net_coverage_beside_the_plain_one(tmp_path: Path, capsys) -> None:
    path = tmp_path / "small.toml"
    path.write_text(SMALL + RAISES)
    cells = generate(load_matrix(str(path)))
    assert main(["list", "--matrix", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{len(cells)} cells (t-wise, t=2): 4 of the covering array, {len(cells) - 4} added net of masking" in out
    assert "coverage t=2: 12/12 allowed 2-tuples covered: OK" in out
    assert f"coverage t=2 net of masking: 11/12 held by a judged cell (1 of {len(cells)} cells masked whole" in out
    assert "no judged cell can hold: masked by [[expected]] #1 (1): model:hybrid+scheduler:priority" in out


def test_list_names_the_pairs_a_choice_of_cells_leaves_to_masked_cells(tmp_path: Path, capsys) -> None:
    """Mode cells adds nothing (the cells are a budget's choice): list says which pairs only masked cells hold."""
    chosen = SMALL.replace('mode = "t-wise"\nstrength = 2', 'mode = "cells"').replace(
        "page_size = [1, 16]", "page_size = [16]") + '\n[golden]\nmodel = "dense"\nscheduler = "fcfs"\n' + \
        '[[cells]]\nchoose = { model = "dense" }\nreason = "r"\n' + \
        '[[cells]]\nchoose = { model = "hybrid", scheduler = "priority" }\nreason = "r"\n'
    path = tmp_path / "small.toml"
    path.write_text(chosen + RAISES)
    assert main(["list", "--matrix", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 cells (cells" in out and "net of masking: 3/8 held by a judged cell (1 of 2 cells masked whole by " \
        "[[expected]]): 2 left to masked cells by [[cells]]" in out, out
    assert "only masked cells hold: masked by [[expected]] #1 (2): model:hybrid+page_size:16, scheduler:priority+page_size:16" in out


def test_list_names_the_one_factor_at_a_time_cells_a_declaration_masks(tmp_path: Path, capsys) -> None:
    """ofat's promise is one cell per change off golden: a masked one cannot be replaced, so list names it."""
    ofat = SMALL.replace('mode = "t-wise"\nstrength = 2', 'mode = "ofat"') + \
        '\n[golden]\nmodel = "hybrid"\nscheduler = "fcfs"\npage_size = 16\n'
    path = tmp_path / "small.toml"
    path.write_text(ofat + RAISES)
    assert main(["list", "--matrix", str(path)]) == 0
    out = capsys.readouterr().out
    assert "coverage ofat net of masking: 3/4 held by a judged cell (1 of 4 cells masked whole by [[expected]]): OK" in out
    assert "no judged cell can hold: masked by [[expected]] #1 (1): scheduler:priority" in out
