"""The pool audit and the NaN poison inside the vLLM child, each shown failing on a bug planted in the installed vLLM
for one run (``planted.py``) and passing without it: a prefix hit that takes no reference names its block, a skipped
running request names its step, a read one slot past what was written is a NaN under poison and nothing without, and a
PD decode side that reads one block fewer than it needs serves NaN under poison."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.oracles import oracles
from harness.results.rows import Verdict
from harness.run.cell import run_cell
from harness.run.golden import GoldenRuns
from harness.sut.vllm import LEVELS as VLLM, vllm_python
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.protocol import audit_problems, request_output, serve_message
from tests.binaries import required_path
from tests.harness.oracles.test_oracles import view

PROGRAM = Path(__file__).with_name("planted.py")
ORACLES = oracles()


def served(plant: str, poison: bool, workload: str = "system_prompt", **levels: object) -> dict:
    """The cold and warm answers of ``workload`` on a dense-model engine with prefix caching (and ``levels``),
    ``plant`` planted."""
    python = required_path(vllm_python(), "vllm-env")
    arguments = engine_arguments(VLLM.full({"cache": "device", **levels}), {})
    message = {"engine_args": arguments, "serve": serve_message(load_workload(workload).requests), "plant": plant,
               "poison": poison}
    run = subprocess.run([str(python), "-I", str(PROGRAM)], input=json.dumps(message), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def judged(oracle: str, answers: dict) -> Verdict:
    """``oracle``'s verdict on both passes, each judged on its own outputs (golden: themselves)."""
    views = [view([request_output(o) for o in answer["outputs"]], name=name, audit=audit_problems(answer))
             for name, answer in answers.items()]
    return ORACLES[oracle](views)


def steps(answers: dict) -> int:
    return sum(answer["audit"]["steps"] for answer in answers.values())


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_hit_that_takes_no_reference_fails_the_audit_naming_its_block() -> None:
    clean = served("none", poison=False)
    assert judged("pool_audit", clean).status == "pass" and steps(clean) > 0, judged("pool_audit", clean).message
    planted = served("no_ref", poison=False)
    verdict = judged("pool_audit", planted)
    assert verdict.status == "fail", verdict.message
    # the first: system_prompt's six requests share its prompt's blocks from the cold pass on, each hit unreferenced
    found = re.match(r"step \d+: block (\d+): ref_cnt (\d+), held by (\d+) block table\(s\) \((.*)\)$",
                     verdict.detail[0]["problem"])
    assert found and int(found[2]) < int(found[3]), verdict.detail[0]
    assert set(found[4].split(", ")) <= {f"sys-{i}" for i in range(6)}, found[4]  # named as the workload names them


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_running_request_skipped_for_a_step_fails_the_audit_naming_the_step() -> None:
    planted = served("skip", poison=False)
    verdict = judged("pool_audit", planted)
    assert verdict.status == "fail", verdict.message
    problem = verdict.detail[0]["problem"]
    assert "running, not preempted, not scheduled" in problem and problem.startswith("step "), problem
    assert judged("tokens", planted).status == "pass"  # only late: every token right


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_read_past_what_was_written_is_nan_under_poison_and_nothing_without() -> None:
    unpoisoned = served("read_past", poison=False)
    verdict = judged("nan", unpoisoned)
    assert verdict.status == "pass", verdict.message
    poisoned = served("read_past", poison=True)
    verdict = judged("nan", poisoned)
    assert verdict.status == "fail" and verdict.detail[0]["where"] == "logprobs", verdict.message
    clean = served("none", poison=True)
    assert judged("nan", clean).status == "pass" and clean["cold"]["poison"]["issued"] > 0, clean["cold"]["poison"]


PD_MATRIX = """
[matrix]
name = "pd_read_one_fewer"
engine = "vllm"
mode = "full"
workloads = ["system_prompt"]
timeout_s = 600

[factors]
pd = ["nixl"]
poison = ["on"]
"""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_decode_side_that_reads_one_block_fewer_serves_nan_under_poison(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, goldens: GoldenRuns) -> None:
    """The pair the harness starts runs the planted child on both sides; the golden (one engine, no NIXL) is the
    plain one's."""
    python = required_path(vllm_python(), "vllm-env")
    wrapper = tmp_path / "planted-python"
    wrapper.write_text(f"#!/bin/sh\nexec {python} -I {PROGRAM} child read_one_fewer\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("KVMATRIX_VLLM_PYTHON", str(wrapper))
    path = tmp_path / "pd_read_one_fewer.toml"
    path.write_text(PD_MATRIX)
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
    assert result.error is None and result.metrics["pd"]["transfers"] > 0, (result.error, result.metrics.get("pd"))
    nan = result.oracles["nan"]
    assert nan.status == "fail" and nan.detail[0]["where"] == "logprobs", nan
    assert result.oracles["tokens"].status == "fail", result.oracles["tokens"]
