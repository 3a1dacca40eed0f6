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
from tests.binaries import required_path
from tests.harness.oracles.test_oracles import output, view

PROGRAM = Path(__file__).with_name("draft_state.py")
ORACLES = oracles()


def judged(answer: dict, workload, rule, k: int):
    """accept_length's verdict on one served pass (golden-with-this-proposer counting the same: the replay alone)."""
    outputs = [output(o["rid"], o["tokens"]) for o in answer["outputs"]]
    return ORACLES["accept_length"]([view(
        outputs, spec="eagle", pass_counted=True, replay=rule, name="cold", max_accept_length=k + 1,
        prompts={r.rid: r.prompt for r in workload.requests}, requested={r.rid: r.max_new_tokens for r in workload.requests},
        spec_reference=outputs, spec_reference_counters=answer["spec"], counters=answer["spec"])])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
def test_a_lost_draft_state_fails_the_replay_while_every_token_stays_right() -> None:
    python = required_path(vllm_python(), "vllm-env")
    levels = VLLM.full({"spec": "eagle", "cache": "device", "num_draft_tokens": 3})
    arguments = engine_arguments(levels, {})
    rule, workload = vllm_traits(levels, arguments).spec.replay, load_workload("long_prompts")
    requests = [{"rid": r.rid, "prompt": list(r.prompt), "max_new_tokens": r.max_new_tokens} for r in workload.requests]
    run = subprocess.run([str(python), "-I", str(PROGRAM)], input=json.dumps({"engine_args": arguments,
                         "requests": requests}), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout.strip().splitlines()[-1])
    assert answers["stale_layers"] == [5]  # the head's zero layer and the dense model's four

    for name in ("cold", "warm"):
        verdict = judged(answers[name], workload, rule, 3)
        assert verdict.status == "pass" and "1 of 1 passes replayed" in verdict.message, (name, verdict.message)
    assert sum(o["num_cached_tokens"] for o in answers["warm"]["outputs"]) > 0  # the warm pass drafted over hits

    stale = answers["stale"]
    assert [o["tokens"] for o in stale["outputs"]] == [o["tokens"] for o in answers["warm"]["outputs"]]
    verdict = judged(stale, workload, rule, 3)
    assert verdict.status == "fail", verdict.message
    found = {f["what"]: f for f in verdict.detail if f["check"] == "replay"}
    assert len(found) == len(verdict.detail) and "accepted_tokens" in found, verdict.detail  # the replay alone
    finding = found["accepted_tokens"]
    assert finding["got"] < int(str(finding["expected"]).split("..")[0]), finding  # fewer accepted than it must
