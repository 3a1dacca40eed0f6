"""A draft whose state is lost, on real vLLM: the EAGLE head made here drafts from its own KV cache, and
accept_length's replay (the dense model one token behind, run by the reference) knows what it must draft. Served
whole, cold and warm over prefix-cached blocks, vLLM drafts exactly that; with the head's KV stale (noise at the scale of
its own keys and values) and the target's kept, every token is still right and only the replay sees the damage (issue 27; SGLang #30393's shape)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.oracles import oracles
from harness.sut.vllm import LEVELS as VLLM, vllm_python
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm.protocol import serve_message
from tests.binaries import required_path
from tests.harness.oracles.test_accept_length import served_view

PROGRAM = Path(__file__).with_name("draft_state.py")
ORACLES = oracles()


def judged(answer: dict, rule):
    """accept_length's verdict on one served pass of long_prompts (golden counting the same: the replay alone)."""
    tokens = {o["rid"]: o["tokens"] for o in answer["outputs"]}
    return ORACLES["accept_length"]([served_view("long_prompts", tokens, answer["spec"], "eagle", 3, rule)])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_lost_draft_state_fails_the_replay_while_every_token_stays_right() -> None:
    python = required_path(vllm_python(), "vllm-env")
    levels = VLLM.full({"spec": "eagle", "cache": "device", "num_draft_tokens": 3})
    arguments = engine_arguments(levels, {})
    rule = vllm_traits(levels, arguments).spec.replay
    serve = serve_message(load_workload("long_prompts").requests)
    run = subprocess.run([str(python), "-I", str(PROGRAM)], input=json.dumps({"engine_args": arguments,
                         "serve": serve}), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout.strip().splitlines()[-1])
    assert answers["stale_layers"] == [5]  # the head's zero layer and the dense model's four

    for name in ("cold", "warm"):
        verdict = judged(answers[name], rule)
        assert verdict.status == "pass" and "1 of 1 passes replayed" in verdict.message, (name, verdict.message)
    assert sum(o["num_cached_tokens"] for o in answers["warm"]["outputs"]) > 0  # the warm pass drafted over hits

    stale = answers["stale"]
    assert [o["tokens"] for o in stale["outputs"]] == [o["tokens"] for o in answers["warm"]["outputs"]]
    verdict = judged(stale, rule)
    assert verdict.status == "fail", verdict.message
    found = {f["what"]: f for f in verdict.detail if f["check"] == "replay"}
    assert len(found) == len(verdict.detail) and "accepted_tokens" in found, verdict.detail  # the replay alone
    finding = found["accepted_tokens"]
    assert finding["got"] < int(str(finding["expected"]).split("..")[0]), finding  # fewer accepted than it must
