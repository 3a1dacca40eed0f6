"""Mode ``cells``: a matrix runs the cells its ``[[cells]]`` entries choose, a budget's choice said in the file,
never a constraint; every entry is checked at load against the factors, the golden levels and the constraints."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.matrix import file as matrix_file, model as matrix_model
from harness.matrix.model import Matrix, MatrixError
from harness.matrix.selection import select_cells

CELLS = """\
[matrix]
name = "chosen"
mode = "cells"
workloads = ["system_prompt"]

[factors]
model = ["dense", "hybrid"]
cache = ["off", "device"]
scheduler = ["fcfs", "priority"]
page_size = [1, 16]

[golden]
page_size = 16

[[constraints]]
forbid = { cache = "off", scheduler = "priority" }
reason = "example: the priority queue is only tried with a cache"

[[cells]]
choose = { model = ["dense", "hybrid"], cache = ["off", "device"] }
reason = "each model with and without the cache, on the golden scheduler and pages"

[[cells]]
choose = { model = "hybrid", cache = "device", scheduler = "priority", page_size = [1, 16] }
reason = "the priority queue on the hybrid model alone, at both page sizes"
# END
"""


def load(tmp_path: Path, text: str = CELLS) -> Matrix:
    """``text`` as matrices/chosen.toml under ``tmp_path``."""
    path = tmp_path / "matrices" / "chosen.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return matrix_file.load_matrix(str(path), known_workloads={"system_prompt", "multi_turn"})


def test_the_chosen_cells_run_in_the_products_order_each_once(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    ids = [cell.cell_id for cell in matrix_model.generate(matrix)]
    assert ids == [
        "/model:dense/cache:off/scheduler:fcfs/page_size:16/",
        "/model:dense/cache:device/scheduler:fcfs/page_size:16/",
        "/model:hybrid/cache:off/scheduler:fcfs/page_size:16/",
        "/model:hybrid/cache:device/scheduler:fcfs/page_size:16/",
        "/model:hybrid/cache:device/scheduler:priority/page_size:1/",
        "/model:hybrid/cache:device/scheduler:priority/page_size:16/",
    ]
    full = load(tmp_path, CELLS.replace('mode = "cells"', 'mode = "full"').split("[[cells]]")[0])
    product = [cell.cell_id for cell in matrix_model.generate(full)]
    assert [cell_id for cell_id in product if cell_id in ids] == ids, "a chosen cell has the id the full product gives it"


def test_an_entry_lists_levels_in_any_order(tmp_path: Path) -> None:
    reordered = CELLS.replace('model = ["dense", "hybrid"], cache = ["off", "device"]', 'cache = ["device", "off"], model = ["hybrid", "dense"]')
    assert reordered != CELLS
    assert matrix_model.generate(load(tmp_path, reordered)) == matrix_model.generate(load(tmp_path))


def test_overlapping_entries_choose_a_cell_once(tmp_path: Path) -> None:
    text = CELLS.replace("# END", '[[cells]]\nchoose = { model = "dense", cache = "device", page_size = [1, 16] }\n'
                                  'reason = "dense at both page sizes"\n')
    cells = matrix_model.generate(load(tmp_path, text))
    assert len(cells) == len(set(cells)) == 7


def test_a_cell_left_out_still_runs_when_named(tmp_path: Path) -> None:
    """A choice cuts what a run takes by default; ``--cell`` still runs any allowed combination."""
    matrix = load(tmp_path)
    left_out = "/model:dense/cache:device/scheduler:priority/page_size:1/"
    assert [c.cell_id for c in select_cells(matrix, matrix_model.generate(matrix), [left_out])] == [left_out]


def test_list_names_each_pair_the_choice_leaves_out_and_passes(tmp_path: Path, capsys) -> None:
    assert main(["list", "--matrix", str(load(tmp_path).path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[6] == "6 cells (cells: chosen by 2 [[cells]] entries)"
    assert out[7].startswith("coverage t=2: ") and " left out by [[cells]]: " in out[7], out
    assert "model:dense+scheduler:priority" in out[7] and "cache:off+scheduler:priority" not in out[7], out


def test_the_projects_smollm2_matrices_choose_their_cells() -> None:
    """Issue 31's budget cuts are choices: no constraint of these matrices forbids what the engines can run."""
    for name in ("smollm2_vllm", "smollm2_vllm_smoke", "smollm2_llamacpp", "smollm2_llamacpp_smoke", "smollm2_llamacpp_amx",
                 "smollm2_vllm_server"):
        matrix = matrix_file.named_matrix(name)
        assert matrix.mode == "cells" and not matrix.constraints and matrix.cell_choices, name


# Each case: (id, text to replace in CELLS, replacement, fragments the one-line message must hold).
BAD = [
    ("only for mode cells", 'mode = "cells"', 'mode = "full"', ["[[cells]] #1", "only for mode 'cells', not 'full'"]),
    ("unknown key", 'reason = "the priority', 'why = 1\nreason = "the priority', ["[[cells]] #2 why", "unknown key"]),
    ("missing choose", 'choose = { model = "hybrid", cache = "device", scheduler = "priority", page_size = [1, 16] }\n',
     "", ["[[cells]] #2 choose", "missing required key"]),
    ("missing reason", 'reason = "the priority queue on the hybrid model alone, at both page sizes"\n', "",
     ["[[cells]] #2 reason", "missing required key"]),
    ("empty reason", 'reason = "the priority queue on the hybrid model alone, at both page sizes"', 'reason = " "',
     ["[[cells]] #2 reason", "empty reason"]),
    ("empty choose", 'choose = { model = "hybrid", cache = "device", scheduler = "priority", page_size = [1, 16] }',
     "choose = {}", ["[[cells]] #2 choose", "empty"]),
    ("unknown level", 'scheduler = "priority", page_size', 'scheduler = "lifo", page_size',
     ["[[cells]] #2 choose.scheduler", "unknown level 'lifo'", "levels: fcfs, priority"]),
    ("unknown factor", 'scheduler = "priority", page_size', 'schedule = "priority", page_size',
     ["[[cells]] #2 choose.schedule", "unknown factor"]),
    ("factor not in matrix", 'scheduler = "priority", page_size', 'pool = "static", page_size',
     ["[[cells]] #2 choose.pool", "'pool' is not in [factors]"]),
    ("unnamed factor without golden", 'choose = { model = ["dense", "hybrid"], cache', "choose = { cache",
     ["[[cells]] #1 choose", "factor 'model' is not named and has no golden level", "among its levels (dense, hybrid)"]),
    ("forbidden by a constraint", 'model = "hybrid", cache = "device", scheduler', 'model = "hybrid", cache = "off", scheduler',
     ["[[cells]] #2 choose", "chooses /model:hybrid/cache:off/scheduler:priority/page_size:1/",
      "[[constraints]] #1 forbids (example: the priority queue"]),
    ("nothing new", "# END", '[[cells]]\nchoose = { model = "dense" }\nreason = "again"',
     ["[[cells]] #3 choose", "chooses no cell that the entries before it do not"]),
    ("level in no chosen cell", 'page_size = [1, 16] }', 'page_size = 16 }',
     ["[factors] page_size", "level 1 is in no cell [[cells]] chooses"]),
    ("workloads in no chosen cell", "# END", '[[workloads]]\nwhen = { model = "dense", scheduler = "priority" }\n'
     'run = ["multi_turn"]\nreason = "r"', ["[[workloads]] #1 when", "no cell [[cells]] chooses has these levels"]),
]


@pytest.mark.parametrize(("old", "new", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_cells_name_file_entry_and_value(tmp_path: Path, old: str, new: str, fragments: list[str]) -> None:
    assert old in CELLS, "the case must change the valid file"
    with pytest.raises(MatrixError) as info:
        load(tmp_path, CELLS.replace(old, new, 1))
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "matrices" / "chosen.toml") + ": "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_mode_cells_needs_an_array_of_entries(tmp_path: Path) -> None:
    head = CELLS.split("[[cells]]")[0]
    with pytest.raises(MatrixError, match=r"chosen\.toml: \[\[cells\]\]: missing \(mode 'cells' runs the cells"):
        load(tmp_path, head)
    with pytest.raises(MatrixError, match=r"chosen\.toml: \[\[cells\]\]: expected an array of tables, got int 1"):
        load(tmp_path, "cells = 1\n" + head)


def test_every_chosen_cell_is_one_of_the_product(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    product = set(itertools.product(*(levels for _, levels in matrix.factors)))
    assert all(tuple(level for _, level in cell.factors) in product for cell in matrix_model.generate(matrix))
