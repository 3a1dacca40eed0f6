"""The extra verify step a PD decode side takes per request (``vllm-pd-nixl-extra-verify-step``, the
``pd = "nixl"`` × proposer declaration in ``matrices/vllm.toml``), shown with the n-gram proposer on a prompt where no
n-gram recurs: the proposer drafts nothing, yet vLLM's counters count one draft of k tokens, none accepted. It is the
scheduler's placeholder padding of the decode side's first step after the KV load (vllm-project/vllm#45237: k drafts
``-1`` no proposer made), counted as a draft (open fix vllm-project/vllm#50518): with the padding switched off in the
same pair (``spec_padding.py``) the next request counts none. No draft KV is involved: the n-gram proposer has none.
The same padding follows a prefix-cache hit that leaves one prompt token: the findings it causes exit 0 (fixed) with
the padding switched off in their scripts' engines (``no_padding/sitecustomize.py``), as the EAGLE chunked-prefill
finding does with the token after each chunk fed to the head (``chunk_tail/sitecustomize.py``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.repro.report import SCRIPT, render
from harness.sut.vllm import LEVELS as VLLM, vllm_python
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.connectors import PREFILL_PARAMS, PREFILL_TOKENS
from harness.sut.vllm.pd import PdPair
from harness.sut.vllm.protocol import SPEC_COUNTERS, serve_message
from reference_impl.request import RequestSpec
from tests.binaries import required_path, run_group

PROGRAM = Path(__file__).with_name("spec_padding.py")
FINDINGS = Path(__file__).resolve().parents[4] / "findings"
#: finding → the folder whose ``sitecustomize.py`` patches its located cause out of the script's engines: the
#: placeholder padding (an extra verify step after a handoff, after a prefix-cache hit), the chunk tail's backup token
FIXES = {"vllm-pd-nixl-extra-verify-step": "no_padding", "vllm-draft-warm-pass": "no_padding",
         "vllm-ngram-warm-pass": "no_padding", "vllm-eagle-chunked-prefill-rejects": "chunk_tail"}
#: distinct tokens: no n-gram of 2 to 4 tokens recurs in the prompt (the n-gram level's lookup), nor, as served here
#: (tokens 40, 206, 50, 82 on the dense model), once decoded
PROMPT = (155, 6, 17, 42, 99, 3, 201, 77)
DECODED = 4


def records(log: Path, role: str, event: str) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["role"] == role and r["event"] == event]


def handed_over(pair: PdPair, request: RequestSpec) -> dict:
    """``request`` prefilled on the pair's prefill side, handed over as vLLM's toy proxy does, decoded on its decode
    side: the decode side's answer."""
    prefilled = pair.prefill.ask(serve_message([request], max_new_tokens=PREFILL_TOKENS,
                                               handoff=[dict(PREFILL_PARAMS)]))
    return pair.decode.ask(serve_message([request], handoff=pair.handoff([request], prefilled["outputs"])))


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_the_decode_sides_placeholder_padding_is_counted_as_a_draft_the_ngram_proposer_never_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = required_path(vllm_python(), "vllm-env")
    wrapper = tmp_path / "traced-python"
    wrapper.write_text(f"#!/bin/sh\nexec {python} -I {PROGRAM} child\n")
    wrapper.chmod(0o755)
    log, switch = tmp_path / "steps.jsonl", tmp_path / "no-padding"
    monkeypatch.setenv("KVMATRIX_VLLM_PYTHON", str(wrapper))
    monkeypatch.setenv("KVMATRIX_TEST_PADDING_LOG", str(log))
    monkeypatch.setenv("KVMATRIX_TEST_NO_PADDING", str(switch))
    levels = VLLM.full({"pd": "nixl", "spec": "ngram"})
    k = int(levels["num_draft_tokens"])
    pair = PdPair("nixl", engine_arguments(levels, {}), {}, 0, levels)
    try:
        # a first handoff on a fresh pair, not judged: on 1 of 8 fresh pairs here its decode side answered no tokens and
        # never scheduled it (a NIXL transfer of a pair just started, not looked into)
        handed_over(pair, RequestSpec("warm-up", PROMPT, DECODED))
        padded = handed_over(pair, RequestSpec("padded", PROMPT, DECODED))
        log_padded = log.read_text()
        switch.touch()
        unpadded = handed_over(pair, RequestSpec("unpadded", PROMPT, DECODED))
        decode_log = pair.decode.tail()
    finally:
        pair.close()

    tokens = [[out["tokens"] for out in answer["outputs"]] for answer in (padded, unpadded)]
    assert tokens[0] == tokens[1] and len(tokens[0][0]) == DECODED, (padded["outputs"], unpadded["outputs"],
                                                                      decode_log[-4000:])
    proposed = [row for r in records(log, "kv_consumer", "propose") for row in r["rows"]]
    assert proposed and all(row["draft"] == [] for row in proposed), proposed  # the proposer drafted nothing
    firsts: dict[str, dict] = {}  # by vLLM's own request id, in the order the decode side first scheduled them
    for record in records(log, "kv_consumer", "schedule"):
        for rid, step in record["requests"].items():
            firsts.setdefault(rid, step)
    assert len(firsts) in (2, 3), firsts
    firsts = dict(zip(("padded", "unpadded"), list(firsts.values())[-2:]))
    # the decode side's first step after the load: the last prompt token left to compute, and with the padding on,
    # k placeholders scheduled behind it
    assert firsts["padded"] == {"computed": len(PROMPT) - 1, "scheduled": 1 + k, "prompt": len(PROMPT),
                                "drafts": [-1] * k}, (firsts, log_padded)
    assert firsts["unpadded"] == {"computed": len(PROMPT) - 1, "scheduled": 1, "prompt": len(PROMPT),
                                  "drafts": []}, firsts
    # vLLM counts the placeholders as a draft of k tokens, all rejected; without them, nothing drafted, nothing counted
    counted = [{name: answer["spec"][name] for name in SPEC_COUNTERS} for answer in (padded, unpadded)]
    assert counted == [{"drafts": 1, "draft_tokens": k, "accepted_tokens": 0},
                       {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}], counted


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-findings")  # beside the findings' own scripts (tests/findings/test_findings.py)
@pytest.mark.parametrize("name", sorted(FIXES))
def test_each_located_finding_is_fixed_by_patching_its_cause_out(name: str, tmp_path: Path) -> None:
    """The finding's own script, its engines patched at the located cause (the ``sitecustomize`` folder on
    ``PYTHONPATH``, so no ``-I``): exit 0 where tests/findings/test_findings.py holds that it exits 1 as written."""
    python = required_path(vllm_python(), "vllm-env")
    (tmp_path / SCRIPT).write_text(render(FINDINGS / name)[SCRIPT])
    done = run_group([str(python), SCRIPT], 600, cwd=tmp_path,
                     env={**os.environ, "PYTHONPATH": str(Path(__file__).with_name(FIXES[name]))})
    assert done.returncode == 0 and "FIXED" in done.stdout, (done.stdout + done.stderr)[-3000:]
