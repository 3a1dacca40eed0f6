"""matrices/sglang_cpu.toml, SGLang on CPU from .venv-sglang (make sglang-env): its launches render to the CPU flags
SGLang 0.5.23 takes (its KV pool capped), NGRAM, the one proposer that starts there, with its crash declared, and
without the venv the matrix is refused at load, not run into error cells. (tests/e2e/test_sglang_cpu.py serves it.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.sut.openai import LEVELS as OPENAI
from harness.sut.openai.launch import Launch, launch_problem

ROOT = Path(__file__).resolve().parents[4]


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
        assert "--device cpu --attention-backend torch_native --dtype float32" in text
        assert "--max-total-tokens 65536" in text  # not 0.716 of the machine's memory
        assert f"--page-size {levels['page_size']} --chunked-prefill-size {levels['prefill_budget']}" in text
        assert ("--disable-radix-cache" in text) == (levels["cache"] == "off")
        assert "--enable-deterministic-inference" not in text  # refused on CPU: not a factor


def test_ngram_is_the_one_proposer_and_its_crash_is_declared(matrix) -> None:
    cells = list(generate(matrix))
    assert {c.level("spec") for c in cells} == {"none", "ngram"}
    ngram = [c for c in cells if c.level("spec") == "ngram"]
    assert all("error: AttributeError" in matrix.expected_for(c)["fails"] for c in ngram)
    argv = argv_of(matrix, spec="ngram")
    assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "3"
    assert "--speculative-draft-model-path" not in argv
    assert all(matrix.expected_for(c) is None for c in cells if c.level("spec") == "none")


def test_without_the_venv_the_matrix_is_refused_naming_it(matrix) -> None:
    server = dict(matrix.engine_args)
    server["command"] = ["{root}/.venv-sglang-missing/bin/python", *server["command"][1:]]
    problem = launch_problem(server)
    assert problem is not None and ".venv-sglang-missing/bin/python" in problem
    if (ROOT / ".venv-sglang" / "bin" / "python").exists():
        assert launch_problem(matrix.engine_args) is None
