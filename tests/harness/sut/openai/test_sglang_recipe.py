"""matrices/sglang.toml, which runs on GPU runners only: its launches render to the flags SGLang 0.5.23 takes,
and recorded SGLang responses (tests/data/servers/sglang/, written from its documented format) read back
into what the oracles judge, a malformed one as an error naming the missing field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.sut.openai import LEVELS as OPENAI
from harness.matrix.model import generate
from harness.oracles.accept_length import pass_accept_length
from harness.sut.openai.launch import Launch
from harness.sut.openai.wire import ServerError, metric_sums, pass_counters, request_output, sglang_body
from reference_impl.request import RequestSpec

ROOT = Path(__file__).resolve().parents[4]
RECORDED = Path(__file__).resolve().parents[4] / "tests" / "data" / "servers" / "sglang"


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(str(ROOT / "matrices" / "sglang.toml"))


def recorded(name: str) -> dict:
    return json.loads((RECORDED / name).read_text())


def request() -> RequestSpec:
    body = recorded("generate_request.json")
    return RequestSpec(rid="r", prompt=body["input_ids"], max_new_tokens=body["sampling_params"]["max_new_tokens"])


def test_the_request_body_is_the_documented_one() -> None:
    body = sglang_body(request(), 2, "kvmatrix")
    want = recorded("generate_request.json")
    assert {k: v for k, v in body.items()} == {k: v for k, v in want.items() if k != "stream"}


def test_a_cell_renders_to_sglang_flags(matrix, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVMATRIX_SGLANG_PYTHON", "/opt/sglang/bin/python")
    cell = next(c for c in generate(matrix) if c.level("spec") == "eagle" and c.level("cache") == "host")
    levels = OPENAI.full(cell.as_dict())
    argv = Launch(matrix.engine_args, levels, 30001).argv
    text = " ".join(argv)
    assert argv[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert "--port 30001" in text and "--skip-tokenizer-init" in text and "--enable-metrics" in text
    assert "--enable-hierarchical-cache --hicache-ratio 2" in text and "--disable-radix-cache" not in text
    assert "--speculative-algorithm EAGLE --speculative-draft-model-path " in text and "sglang_eagle-" in text
    assert f"--speculative-num-steps {levels['num_draft_tokens']} --speculative-eagle-topk 1" in text
    assert f"--page-size {levels['page_size']}" in text and f"--attention-backend {levels['attention_backend']}" in text
    assert ("--enable-deterministic-inference" in text) == (levels["deterministic"] == "on")


def test_what_sglang_overrides_silently_runs_and_is_read_back(matrix) -> None:
    """Deterministic inference on flashinfer turns the radix cache off: those cells run (no constraint takes them out)
    and are judged by the cache SGLang applied, read back (test_sglang_server.py), with nothing declared to excuse."""
    overridden = [c for c in generate(matrix) if c.level("deterministic") == "on"
                  and c.level("attention_backend") == "flashinfer" and c.level("cache") != "off"]
    assert overridden and not matrix.constraints
    assert matrix.engine_args["read_back"] == "sglang"
    assert all(matrix.expected_for(cell) is None for cell in overridden)


def test_a_greedy_response_reads_back(matrix) -> None:
    doc = recorded("generate_greedy.json")
    reply = request_output(matrix.engine_args, request(), doc, counted=False)
    out, counters = reply.output, reply.counters
    assert out.tokens == doc["output_ids"] and len(out.logprobs) == 4 and out.cached_tokens == 0
    assert [ids[0] for ids in out.top_ids] == out.tokens and all(m > 0 for m in out.margins)
    assert out.finish_reason == "length" and counters == {}


def test_a_cached_speculative_response_gives_sglangs_accept_length(matrix) -> None:
    doc = recorded("generate_cached_spec.json")
    reply = request_output(matrix.engine_args, request(), doc)
    out, counters = reply.output, reply.counters
    assert out.cached_tokens == 4 and counters == {"verify_steps": 2}
    settled = pass_counters(counters, [out])
    assert settled == {"drafts": 2, "accepted_tokens": 2}
    assert pass_accept_length(settled) == doc["meta_info"]["spec_accept_length"]


def test_a_response_without_its_logprobs_is_an_error_naming_the_field(matrix) -> None:
    with pytest.raises(ServerError, match=r"no field 'meta_info.output_token_logprobs'"):
        request_output(matrix.engine_args, request(), recorded("generate_malformed_missing_logprobs.json"), counted=False)


def test_metrics_diff_per_pass() -> None:
    before = metric_sums((RECORDED / "metrics_before.txt").read_text())
    after = metric_sums((RECORDED / "metrics_after.txt").read_text())
    assert after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"] == 4
    assert "sglang:cached_tokens_total" not in before and after["sglang:cached_tokens_total"] == 4


def test_sglangs_eagle_head_is_vllms_in_sglangs_layout() -> None:
    from safetensors.torch import load_file

    from harness.models.checkpoints import checkpoint_dir

    vllm_head, sglang_head = checkpoint_dir("eagle"), checkpoint_dir("sglang_eagle")
    assert json.loads((sglang_head / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle"]
    ours, theirs = load_file(vllm_head / "model.safetensors"), load_file(sglang_head / "model.safetensors")
    assert set(theirs) == set(ours) | {"fc.bias"} and not theirs["fc.bias"].any()
    assert all((theirs[name] == tensor).all() for name, tensor in ours.items())
