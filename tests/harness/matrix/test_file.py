"""Matrix files: loading, validation errors that name the input, and the tables read from them (``[golden]``,
``[[workloads]]``, ``[cost]``); the cells generated from a loaded file are in test_model.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.matrix import file as matrix_file, model as matrix_model
from harness.sut.reference import LEVELS as REFERENCE
from harness.matrix.model import Cell, MatrixError, Matrix

VALID = """\
[matrix]
name = "smoke"
description = "a small matrix"
mode = "t-wise"
strength = 2
workloads = ["system_prompt", "multi_turn"]
timeout_s = 300

[factors]
model = ["dense", "hybrid"]
cache = ["off", "device"]
scheduler = ["fcfs", "priority"]
page_size = [1, 16]

[golden]
scheduler = "fcfs"

[[constraints]]
forbid = { cache = "off", scheduler = ["priority"] }
reason = "example: the priority queue is only tried with a cache"
# END
"""
MATRIX_BLOCK = VALID[: VALID.index("[factors]")]
#: a [[stronger]] group to append to VALID (mixed strength: three factors 3-wise inside the 2-wise matrix).
STRONGER = '[[stronger]]\nfactors = ["cache", "scheduler", "page_size"]\nstrength = 3\n# END\n'

#: a [[workloads]] entry to append to VALID: long pages run the cheaper workload.
RULE = '[[workloads]]\nwhen = { page_size = 16 }\nrun = ["multi_turn"]\nreason = "the cheap one"\n# END\n'

FACTOR_LINES = VALID[VALID.index("model = ") : VALID.index("[golden]")]
WORKLOADS = {"system_prompt", "multi_turn", "high_load"}


def write(tmp_path: Path, text: str, name: str = "smoke") -> Path:
    """Write ``matrices/<name>.toml`` under ``tmp_path`` and return its path."""
    path = tmp_path / "matrices" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str = VALID, mode: str | None = None) -> Matrix:
    """Load ``text`` as matrices/smoke.toml, optionally switched to another mode."""
    matrix = matrix_file.load_matrix(str(write(tmp_path, text)), known_workloads=WORKLOADS)
    return matrix if mode is None else dataclasses.replace(matrix, mode=mode, strength=None)


def test_valid_file_loads(tmp_path: Path) -> None:
    matrix = load(tmp_path)
    assert (matrix.name, matrix.mode, matrix.strength, matrix.timeout_s) == ("smoke", "t-wise", 2, 300.0)
    assert matrix.description == "a small matrix"
    assert matrix.workloads == ("system_prompt", "multi_turn")
    assert matrix.factors == (("model", ("dense", "hybrid")), ("cache", ("off", "device")),
                            ("scheduler", ("fcfs", "priority")), ("page_size", (1, 16)))
    assert [dict(c.forbid) for c in matrix.constraints] == [{"cache": ("off",), "scheduler": ("priority",)}]
    assert dict(matrix.golden) == {**REFERENCE.golden, "scheduler": "fcfs"}


def test_defaults(tmp_path: Path) -> None:
    text = '[matrix]\nname = "smoke"\nmode = "full"\n[factors]\nmodel = ["dense"]\n'
    matrix = load(tmp_path, text)
    assert (matrix.description, matrix.strength, matrix.workloads, matrix.timeout_s) == ("", None, (), 600.0)
    assert matrix.constraints == () and dict(matrix.golden) == dict(REFERENCE.golden)


def test_search_moves_reach_the_covering_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[matrix] search_moves`` is the generator's move budget; without it the default."""
    assert load(tmp_path).search_moves == matrix_model.covering.DEFAULT_MOVES
    matrix = load(tmp_path, VALID.replace("strength = 2", "strength = 2\nsearch_moves = 1234"))
    seen: list[int] = []
    real = matrix_model.covering.solve

    def spy(*args: object, moves: int, **kwargs: object) -> matrix_model.covering.Covering:
        seen.append(moves)
        return real(*args, moves=moves, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(matrix_model.covering, "solve", spy)
    assert matrix_model.generate(matrix) and seen == [1234]


def test_resolve_by_name_and_by_path(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    assert matrix_file.resolve_matrix_path("smoke", tmp_path / "matrices") == path
    assert matrix_file.resolve_matrix_path(str(path)) == path
    assert matrix_file.load_matrix("smoke", matrices_dir=tmp_path / "matrices").path == path


def test_missing_matrix_lists_the_available_ones(tmp_path: Path) -> None:
    write(tmp_path, VALID)
    write(tmp_path, VALID.replace('"smoke"', '"nightly"'), name="nightly")
    with pytest.raises(MatrixError, match=r"smok\.toml: no such matrix .*: nightly, smoke\)$"):
        matrix_file.resolve_matrix_path("smok", tmp_path / "matrices")


def test_golden_table_overrides_the_default(tmp_path: Path) -> None:
    matrix = load(tmp_path, VALID.replace('scheduler = "fcfs"\n', 'cache = "device"\npage_size = 16\n'))
    assert matrix.golden_cell().cell_id == "/model:dense/cache:device/scheduler:fcfs/page_size:16/"
    assert matrix_model.generate(dataclasses.replace(matrix, mode="ofat", strength=None))[0] == matrix.golden_cell()


# Each case: (id, text to replace in VALID, replacement, fragments the one-line message must hold).
BAD = [
    ("syntax", "[matrix]\n", "[matrix\n", ["TOML syntax error", "line 1"]),
    ("unknown table", "# END", "[extra]\nx = 1", ["[extra]", "unknown table"]),
    ("unknown top key", "[matrix]\n", "colour = 1\n[matrix]\n", ["colour", "unknown key"]),
    ("matrix not a table", MATRIX_BLOCK, "matrix = 1\n", ["[matrix]", "expected a table", "int 1"]),
    ("missing matrix", MATRIX_BLOCK, "", ["[matrix]", "missing required table"]),
    ("unknown matrix key", 'mode = "t-wise"', 'modee = "t-wise"', ["[matrix] modee", "unknown key"]),
    ("missing name", 'name = "smoke"\n', "", ["[matrix] name", "missing"]),
    ("missing factors", "[factors]\n" + FACTOR_LINES, "", ["[factors]", "missing required table"]),
    ("name type", 'name = "smoke"', "name = 3", ["[matrix] name", "int 3"]),
    ("name mismatch", 'name = "smoke"', 'name = "other"', ["[matrix] name", "'other'", "'smoke'"]),
    ("unknown mode", 'mode = "t-wise"', 'mode = "pairs"', ["[matrix] mode", "'pairs'"]),
    ("strength missing", "strength = 2\n", "", ["[matrix] strength", "missing"]),
    ("strength with full", 'mode = "t-wise"', 'mode = "full"', ["[matrix] strength", "2", "'full'"]),
    ("strength zero", "strength = 2", "strength = 0", ["[matrix] strength", "0 is out of range 1..4"]),
    ("strength too big", "strength = 2", "strength = 5", ["[matrix] strength", "5 is out of range"]),
    ("strength string", "strength = 2", 'strength = "2"', ["[matrix] strength", "must be an integer", "str '2'"]),
    ("strength float", "strength = 2", "strength = 2.0", ["[matrix] strength", "must be an integer", "float 2.0"]),
    ("strength bool", "strength = 2", "strength = true", ["[matrix] strength", "must be an integer", "bool True"]),
    ("search_moves negative", "strength = 2", "strength = 2\nsearch_moves = -1",
     ["[matrix] search_moves", "-1 is outside 0..10,000,000", "0 turns the fixed-size search off"]),
    ("search_moves too many", "strength = 2", "strength = 2\nsearch_moves = 20000000",
     ["[matrix] search_moves", "20000000 is outside 0..10,000,000"]),
    ("search_moves string", "strength = 2", 'strength = 2\nsearch_moves = "5000"',
     ["[matrix] search_moves", "must be an integer number of moves", "str '5000'"]),
    ("search_moves float", "strength = 2", "strength = 2\nsearch_moves = 5e3", ["[matrix] search_moves", "float 5000.0"]),
    ("search_moves bool", "strength = 2", "strength = 2\nsearch_moves = true", ["[matrix] search_moves", "bool True"]),
    ("search_moves with full", 'mode = "t-wise"\nstrength = 2', 'mode = "full"\nsearch_moves = 5000',
     ["[matrix] search_moves", "'full'", "only for 't-wise'"]),
    ("timeout negative", "timeout_s = 300", "timeout_s = -1", ["[matrix] timeout_s", "-1"]),
    ("timeout string", "timeout_s = 300", 'timeout_s = "300"', ["[matrix] timeout_s", "'300'"]),
    ("description type", 'description = "a small matrix"', "description = 3", ["[matrix] description", "3"]),
    ("workloads type", 'workloads = ["system_prompt", "multi_turn"]', 'workloads = "x"',
     ["[matrix] workloads", "'x'"]),
    ("workload unknown", '"multi_turn"]', '"nope"]', ["[matrix] workloads", "'nope'", "high_load"]),
    ("workload duplicate", '"multi_turn"]', '"system_prompt"]', ["[matrix] workloads", "duplicate", "'system_prompt'"]),
    ("factors empty", FACTOR_LINES, "", ["[factors]", "no factors"]),
    ("unknown factor", "cache = [", "cahce = [", ["[factors] cahce", "unknown factor", "known: backend, cache"]),
    ("empty levels", 'cache = ["off", "device"]', "cache = []", ["[factors] cache", "empty level list"]),
    ("levels not a list", 'cache = ["off", "device"]', 'cache = "off"', ["[factors] cache", "'off'"]),
    ("duplicate level", 'cache = ["off", "device"]', 'cache = ["off", "device", "off"]',
     ["[factors] cache", "duplicate level 'off'"]),
    ("registry rejects", 'cache = ["off", "device"]', 'cache = ["off", "disk"]', ["[factors] cache", "'disk'"]),
    ("page size zero", "page_size = [1, 16]", "page_size = [1, 0]", ["[factors] page_size", "0"]),
    ("page size string", "page_size = [1, 16]", 'page_size = [1, "16"]', ["[factors] page_size", "'16'"]),
    ("id tokens collide", 'cache = ["off", "device"]',
     'cache = ["off", "reference_impl.cache.radix:RadixCache", "reference_impl.cache.host_cache:RadixCache"]',
     ["[factors] cache", "'reference_impl.cache.host_cache:RadixCache'", "cell-id name 'RadixCache'",
      "'reference_impl.cache.radix:RadixCache'"]),
    ("id token empty", 'cache = ["off", "device"]', 'cache = ["off", "a.b:"]', ["[factors] cache", "'a.b:'"]),
    ("constraint unknown level", 'forbid = { cache = "off"', 'forbid = { cache = "disk"',
     ["[[constraints]] #1 forbid.cache", "unknown level 'disk'", "levels: off, device"]),
    ("constraint unknown factor", 'forbid = { cache = "off"', 'forbid = { cahce = "off"',
     ["[[constraints]] #1 forbid.cahce", "unknown factor"]),
    ("constraint factor not in matrix", 'forbid = { cache = "off"', 'forbid = { pool = "static"',
     ["[[constraints]] #1 forbid.pool", "'pool' is not in [factors]"]),
    ("constraint empty list", 'scheduler = ["priority"]', "scheduler = []", ["#1 forbid.scheduler", "empty"]),
    ("constraint duplicate level", 'scheduler = ["priority"]', 'scheduler = ["priority", "priority"]',
     ["#1 forbid.scheduler", "duplicate level 'priority'"]),
    ("constraint wrong type level", 'scheduler = ["priority"]', "scheduler = 1",
     ["#1 forbid.scheduler", "unknown level 1"]),
    ("second constraint", "# END", '[[constraints]]\nforbid = { page_size = 32 }\nreason = "r"',
     ["[[constraints]] #2 forbid.page_size", "unknown level 32", "levels: 1, 16"]),
    ("missing reason", 'reason = "example: the priority queue is only tried with a cache"\n', "",
     ["[[constraints]] #1 reason", "missing"]),
    ("empty reason", 'reason = "example: the priority queue is only tried with a cache"', 'reason = " "',
     ["[[constraints]] #1 reason", "empty"]),
    ("missing forbid", 'forbid = { cache = "off", scheduler = ["priority"] }\n', "",
     ["[[constraints]] #1 forbid", "missing"]),
    ("empty forbid", 'forbid = { cache = "off", scheduler = ["priority"] }', "forbid = {}",
     ["[[constraints]] #1 forbid", "empty"]),
    ("unknown constraint key", "# END", 'why = "x"', ["[[constraints]] #1 why", "unknown key"]),
    ("constraints not an array", "[[constraints]]", "[constraints]", ["[[constraints]]", "expected an array"]),
    ("every row forbidden", "# END", '[[constraints]]\nforbid = { cache = "device" }\nreason = "r"\n'
     '[[constraints]]\nforbid = { cache = "off" }\nreason = "r"', ["[[constraints]]", "every row is forbidden"]),
    ("golden forbidden", "# END", '[[constraints]]\nforbid = { model = "dense", page_size = 1 }\nreason = "r2"',
     ["[golden]", "golden cell /model:dense/cache:off/scheduler:fcfs/page_size:1/", "#2", "r2"]),
    ("golden unknown factor", 'scheduler = "fcfs"\n\n', 'cahce = "off"\n\n', ["[golden] cahce", "unknown factor"]),
    ("golden registry rejects", 'scheduler = "fcfs"\n\n', 'cache = "disk"\n\n', ["[golden] cache", "'disk'"]),
    ("golden not a level", 'scheduler = "fcfs"\n\n', 'page_size = 32\n\n',
     ["[golden] page_size", "golden level 32", "levels: 1, 16"]),
    ("golden factor not in matrix", 'scheduler = "fcfs"\n\n', 'pool = "static"\n\n',
     ["[golden] pool", "'pool' is not in [factors]"]),
    ("level import fails", 'scheduler = ["fcfs", "priority"]', 'scheduler = ["fcfs", "no.such.module:Queue"]',
     ["[factors] scheduler", "cannot import module 'no.such.module'", "'no.such.module:Queue'"]),
    ("level import no attribute", 'scheduler = ["fcfs", "priority"]', 'scheduler = ["fcfs", "tests.components:NoSuchQueue"]',
     ["[factors] scheduler", "has no attribute 'NoSuchQueue'"]),
    ("level in no allowed row", "# END", '[[constraints]]\nforbid = { page_size = 16, model = ["dense", "hybrid"] }\n'
     'reason = "r"', ["[factors] page_size", "level 16 is in no allowed row", "#2"]),
    ("level in no allowed row together", "# END", '[[constraints]]\nforbid = { page_size = 16, model = "dense" }\n'
     'reason = "r"\n[[constraints]]\nforbid = { page_size = 16, model = "hybrid" }\nreason = "r"',
     ["[factors] page_size", "level 16 is in no allowed row", "#2, #3"]),
    ("cost not a table", "[matrix]\n", "cost = 1\n[matrix]\n", ["[cost]", "expected a table", "int 1"]),
    ("cost unknown factor", "# END", "[cost]\ncahce = { off = 2 }", ["[cost] cahce", "unknown factor"]),
    ("cost factor not in matrix", "# END", "[cost]\npool = { static = 2 }", ["[cost] pool", "'pool' is not in [factors]"]),
    ("cost unknown level", "# END", "[cost]\ncache = { disk = 2 }",
     ["[cost] cache.disk", "unknown level 'disk'", "levels: off, device"]),
    ("cost not a level table", "# END", "[cost]\ncache = 2", ["[cost] cache", "expected a table", "int 2"]),
    ("cost string", "# END", '[cost]\ncache = { device = "2" }', ["[cost] cache.device", "positive number", "'2'"]),
    ("cost bool", "# END", "[cost]\ncache = { device = true }", ["[cost] cache.device", "True"]),
    ("cost zero", "# END", "[cost]\ncache = { device = 0 }", ["[cost] cache.device", "0 is not a positive finite cost"]),
    ("cost negative", "# END", "[cost]\ncache = { device = -2.5 }", ["[cost] cache.device", "-2.5 is not a positive"]),
    ("cost infinite", "# END", "[cost]\ncache = { device = inf }", ["[cost] cache.device", "inf is not a positive"]),
    ("cost too large", "# END", "[cost]\ncache = { device = 1e308 }", ["[cost] cache.device", "1e+308 is too large"]),
    ("stronger not t-wise", 'mode = "t-wise"\nstrength = 2', 'mode = "full"',
     ["[[stronger]] #1", "only for mode 't-wise'"]),
    ("stronger unknown factor", '"scheduler", "page_size"]', '"scheduler", "pool"]',
     ["[[stronger]] #1 factors", "'pool' is not in [factors]"]),
    ("stronger strength not above", "strength = 3\n# END", "strength = 2\n# END",
     ["[[stronger]] #1 strength", "2 must be above the matrix strength 2"]),
    ("stronger strength string", "strength = 3\n# END", 'strength = "3"\n# END',
     ["[[stronger]] #1 strength", "must be an integer"]),
    ("workloads not an array", "[[workloads]]", "[workloads]", ["[[workloads]]", "expected an array of tables"]),
    ("workloads unknown key", 'reason = "the cheap one"', 'why = 1\nreason = "x"', ["[[workloads]] #1 why", "unknown key"]),
    ("workloads missing when", "when = { page_size = 16 }\n", "", ["[[workloads]] #1 when", "missing required key"]),
    ("workloads when unknown level", "page_size = 16 }", "page_size = 32 }",
     ["[[workloads]] #1 when.page_size", "unknown level 32", "levels: 1, 16"]),
    ("workloads when factor not in matrix", "when = { page_size = 16 }", 'when = { pool = "static" }',
     ["[[workloads]] #1 when.pool", "'pool' is not in [factors]"]),
    ("workloads when empty", "when = { page_size = 16 }", "when = {}", ["[[workloads]] #1 when", "empty"]),
    ("workloads run unknown", 'run = ["multi_turn"]', 'run = ["nope"]', ["[[workloads]] #1 run", "'nope'", "high_load"]),
    ("workloads run empty", 'run = ["multi_turn"]', "run = []", ["[[workloads]] #1 run", "empty"]),
    ("workloads run duplicate", 'run = ["multi_turn"]', 'run = ["multi_turn", "multi_turn"]',
     ["[[workloads]] #1 run", "duplicate workload 'multi_turn'"]),
    ("workloads run not a list", 'run = ["multi_turn"]', 'run = "multi_turn"', ["[[workloads]] #1 run", "'multi_turn'"]),
    ("workloads empty reason", 'reason = "the cheap one"', 'reason = ""', ["[[workloads]] #1 reason", "empty"]),
    ("workloads matches no allowed cell", "when = { page_size = 16 }", 'when = { cache = "off", scheduler = "priority" }',
     ["[[workloads]] #1 when", "no allowed cell"]),
]


@pytest.mark.parametrize(("old", "new", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_names_file_key_and_value(tmp_path: Path, old: str, new: str, fragments: list[str]) -> None:
    base = VALID + STRONGER if "stronger" in (old + new + " ".join(fragments)) else VALID
    base = base + RULE if "[[workloads]]" in " ".join(fragments) else base
    assert old in base, "the case must change the valid file"
    with pytest.raises(MatrixError) as info:
        load(tmp_path, base.replace(old, new, 1))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "matrices" / "smoke.toml") + ": ")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_message_path_is_relative_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, VALID.replace('mode = "t-wise"', 'mode = "pairs"'))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MatrixError, match=r"^matrices/smoke\.toml: \[matrix\] mode: unknown mode 'pairs'"):
        matrix_file.load_matrix("smoke")


def test_first_matching_workload_entry_wins_and_other_cells_run_the_default(tmp_path: Path) -> None:
    second = '[[workloads]]\nwhen = { page_size = [1, 16], model = "hybrid" }\nrun = ["high_load"]\nreason = "r"\n'
    matrix = load(tmp_path, VALID + RULE + second, mode="full")
    runs = {cell.cell_id: matrix.workloads_for(cell) for cell in matrix_model.generate(matrix)}
    assert runs["/model:hybrid/cache:off/scheduler:fcfs/page_size:16/"] == ("multi_turn",)
    assert runs["/model:hybrid/cache:off/scheduler:fcfs/page_size:1/"] == ("high_load",)
    assert runs["/model:dense/cache:device/scheduler:fcfs/page_size:1/"] == ("system_prompt", "multi_turn")
    assert [c.cell_id for c in matrix_model.generate(matrix)] == [c.cell_id for c in matrix_model.generate(load(tmp_path, mode="full"))]


def test_workloads_are_free_without_a_known_set(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace('"multi_turn"]', '"anything"]'))
    assert matrix_file.load_matrix(str(path)).workloads == ("system_prompt", "anything")


def test_default_golden_outside_the_levels_still_configures_the_golden_run(tmp_path: Path) -> None:
    """page_size = [16] with the default golden page_size 1: cells compare against a page_size-1 run."""
    path = tmp_path / "one.toml"
    path.write_text('[matrix]\nname = "one"\nmode = "full"\n\n[factors]\nmodel = ["dense"]\npage_size = [16]\n')
    matrix = matrix_file.load_matrix(str(path))
    (cell,) = matrix_model.generate(matrix)
    assert matrix.golden_cell() == cell
    assert matrix.golden_of(cell).as_dict() == {"model": "dense", "page_size": 1}


def test_cost_table_parses_levels_by_name_and_prices_cells(tmp_path: Path) -> None:
    matrix = load(tmp_path, VALID.replace("# END", '[cost]\npage_size = { 16 = 3 }\ncache = { device = 2.5 }'))
    assert {factor: dict(levels) for factor, levels in matrix.cost.items()} == {"page_size": {16: 3.0},
                                                                            "cache": {"device": 2.5}}
    cell = Cell((("model", "dense"), ("cache", "device"), ("scheduler", "fcfs"), ("page_size", 16)))
    assert matrix.cost_of(cell) == 1 + 2.5 + 1 + 3


def test_cost_changes_only_t_wise_cells(tmp_path: Path) -> None:
    plain = load(tmp_path)
    priced = load(tmp_path, VALID.replace("# END", '[cost]\nmodel = { hybrid = 50 }'))
    for mode in ("full", "ofat"):
        as_mode = {"mode": mode, "strength": None}
        assert matrix_model.generate(dataclasses.replace(priced, **as_mode)) == matrix_model.generate(
            dataclasses.replace(plain, **as_mode))
    cells = matrix_model.generate(priced)
    assert len(cells) == len(matrix_model.generate(plain)) and matrix_model.coverage(priced, cells, 2).ok


def test_smoke_matrix_cost_keeps_triton_in_the_four_cells_pairwise_needs() -> None:
    """Triton must meet each of spec's 4 levels; without [cost] the generator puts it in 6 of the 12 cells."""
    matrix = matrix_file.load_matrix(str(Path(__file__).resolve().parents[3] / "matrices" / "smoke.toml"))
    assert dict(matrix.cost["backend"]) == {"triton": 50.0}
    cells = matrix_model.generate(matrix)
    assert len(cells) == matrix_model.lower_bound(matrix, 2) == 12
    assert sum(cell.level("backend") == "triton" for cell in cells) == 4
    assert matrix_model.coverage(matrix, cells, 2).ok
