"""matrices/sglang_cpu.toml, SGLang on a CPU with AMX from .venv-sglang (make sglang-env): its launches render to the
CPU flags SGLang 0.5.23 takes (bf16, its KV pool capped), the kernel path a factor whose intel_amx level needs
amx_tile (refused at load on a CPU without it, naming the flag), the draft proposer only where SGLang starts it, each
crash declared for the host that shows it; without the venv the matrix is refused at load, not run into error cells.
(tests/e2e/test_sglang_cpu.py serves the smoke, which runs on any CPU.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.matrix.model import MatrixError, generate
from harness.run.session import check_runnable
from harness.sut.host import flags_of
from harness.sut.openai import LEVELS as OPENAI
from harness.sut.openai.launch import Launch, launch_problem

ROOT = Path(__file__).resolve().parents[4]
HOSTS = ROOT / "tests" / "data" / "hosts"
EPYC, XEON_AMX = (flags_of((HOSTS / f"cpuinfo_{name}.txt").read_text()) for name in ("epyc", "xeon_amx"))


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(str(ROOT / "matrices" / "sglang_cpu.toml"))


def argv_of(matrix, **levels: object) -> list[str]:
    """The launch of the first cell with these levels."""
    cell = next(c for c in generate(matrix) if all(c.level(f) == v for f, v in levels.items()))
    return Launch(matrix.engine_args, OPENAI.full(cell.as_dict()), 30001).argv


def test_every_cell_serves_on_cpu_from_the_sglang_venv(matrix) -> None:
    assert matrix.engine_args["env"] == {"SGLANG_USE_CPU_ENGINE": "1"}
    for cell in generate(matrix):
        levels = OPENAI.full(cell.as_dict())
        text = " ".join(Launch(matrix.engine_args, levels, 30001).argv)
        assert text.startswith(f"{ROOT}/.venv-sglang/bin/python -m sglang.launch_server ")
        assert "--device cpu --dtype bfloat16" in text  # a CPU with AMX serves no fp32 model
        assert f"--attention-backend {levels['attention_backend']}" in text
        assert "--max-total-tokens 65536" in text  # not 0.716 of the machine's memory
        assert f"--page-size {levels['page_size']} --chunked-prefill-size {levels['prefill_budget']}" in text
        assert ("--disable-radix-cache" in text) == (levels["cache"] == "off")
        assert "--enable-deterministic-inference" not in text  # refused on CPU: not a factor


def test_the_kernel_path_is_crossed_and_intel_amx_needs_amx_tile(matrix, monkeypatch) -> None:
    from harness.sut.openai import launch

    cells = list(generate(matrix))
    assert {c.level("attention_backend") for c in cells} == {"torch_native", "intel_amx"}
    monkeypatch.setattr(launch, "launch_problem", lambda server: None)  # with or without the venv here
    check_runnable(matrix, "cpu", XEON_AMX)
    with pytest.raises(MatrixError, match="attention_backend: level 'intel_amx' needs CPU flag.s. amx_tile"):
        check_runnable(matrix, "cpu", EPYC)


def test_the_draft_proposer_runs_on_intel_amx_only_and_each_crash_is_declared_where_it_shows(matrix,
                                                                                            monkeypatch) -> None:
    from harness.matrix import model

    cells = list(generate(matrix))
    assert {c.level("spec") for c in cells} == {"none", "ngram", "draft"}
    assert {c.level("attention_backend") for c in cells if c.level("spec") == "draft"} == {"intel_amx"}
    argv = argv_of(matrix, spec="draft")
    assert argv[argv.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    # the kernel built here is older than the wheel (intel_amx); NGRAM crashes torch_native, the cell's own server or
    # its spec golden; a draft cell's spec golden is torch_native with the draft, which SGLang refuses
    by_spec = {"none": [], "ngram": ["error: AttributeError"], "draft": ["error: ValueError"]}
    for flags, amx in ((XEON_AMX, ["error: RuntimeError"]), (EPYC, [])):  # intel_amx's only where it is taken
        monkeypatch.setattr(model, "cpu_flags", lambda flags=flags: flags)
        for cell in cells:
            fails = (amx if cell.level("attention_backend") == "intel_amx" else []) + by_spec[cell.level("spec")]
            assert sorted((matrix.expected_for(cell) or {}).get("fails", [])) == sorted(fails), cell


def test_on_a_cpu_with_amx_the_smokes_fp32_cells_are_the_declared_crash(monkeypatch) -> None:
    from harness.matrix import model

    smoke = load_matrix(str(ROOT / "matrices" / "sglang_cpu_smoke.toml"))
    for flags, declared in ((XEON_AMX, ["error: NotImplementedError"]), (EPYC, None)):
        monkeypatch.setattr(model, "cpu_flags", lambda flags=flags: flags)
        for cell in generate(smoke):
            assert (smoke.expected_for(cell) or {}).get("fails") == declared, cell


def test_without_the_venv_the_matrix_is_refused_naming_it(matrix) -> None:
    server = dict(matrix.engine_args)
    server["command"] = ["{root}/.venv-sglang-missing/bin/python", *server["command"][1:]]
    problem = launch_problem(server)
    assert problem is not None and ".venv-sglang-missing/bin/python" in problem
    if (ROOT / ".venv-sglang" / "bin" / "python").exists():
        assert launch_problem(matrix.engine_args) is None
