"""Run with vLLM's interpreter by test_spec_padding.py: the harness's child (``harness/sut/vllm/child.py``) with vLLM's
scheduler and n-gram proposer traced for this process only, and the scheduler's placeholder padding switchable.

vLLM 0.32.0's scheduler (``v1/core/sched/scheduler.py``, ``Scheduler.schedule``, the waiting-request branch, "Pad new
decode requests to uniform spec decoding size", vllm-project/vllm#45237) schedules a waiting request that has exactly
one token left to compute and some already computed (a PD decode side after its KV load, a prefix-cache hit) as
``1 + k`` tokens, with ``k`` placeholder drafts ``[-1] * k`` that no proposer made, whenever nothing was prefilled
before it in the step and the step's budget holds them. Every placeholder is rejected, and vLLM's speculative counters
count the step as a draft of ``k`` tokens (``make_spec_decoding_stats``; open fix vllm-project/vllm#50518).

- ``$KVMATRIX_TEST_PADDING_LOG``: a file each scheduled step's requests are appended to as JSON lines (the engine's
  ``kv_role``, each request's computed tokens before the step, its scheduled tokens and scheduled drafts), and each
  call of the n-gram proposer (the rows it was asked for and the drafts it returned);
- ``$KVMATRIX_TEST_NO_PADDING``: a path; while a file is there the padding is off. The scheduler's
  ``dynamic_sd_lookup`` is set to the same ``k`` at every batch size, which schedules exactly what it would without
  one, and its only other use is to switch the padding off (``self.dynamic_sd_lookup is None`` in its condition).

``spec_padding.py child`` is the harness's child itself, so traced (``KVMATRIX_VLLM_PYTHON`` pointed at a wrapper that
runs it): a PD pair started with it runs the trace on both sides.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "harness" / "sut" / "vllm"))
import child  # noqa: E402  (the child imports only the standard library, vllm and torch)

LOG_ENV = "KVMATRIX_TEST_PADDING_LOG"
SWITCH_ENV = "KVMATRIX_TEST_NO_PADDING"


def log(record: dict) -> None:
    with open(os.environ[LOG_ENV], "a") as out:
        out.write(json.dumps(record) + "\n")


def trace_ngram(role: str) -> None:
    """Each call of the n-gram proposer logged: for each row it is asked to draft (one with a sampled token), the
    context it matches in and the draft it returns. Patched once the scheduler exists: the worker, built before it,
    scans every loaded module at start (``triton_utils/dispatcher.py``, ``_rebind_kernels``) and fails on one of
    numba's, which importing the proposer's module earlier would load."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    propose = NgramProposer.propose
    if getattr(propose, "traced", False):
        return

    def traced(self: Any, k: int, sampled: list, num_tokens: Any, token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        drafts = propose(self, k, sampled, num_tokens, token_ids, *args, **kwargs)
        rows = [{"context": token_ids[i, :num_tokens[i]].tolist(), "draft": list(drafts[i])}
                for i, ids in enumerate(sampled) if ids]
        if rows:
            log({"role": role, "event": "propose", "rows": rows})
        return drafts

    traced.traced = True
    NgramProposer.propose = traced


def trace() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    init, schedule = Scheduler.__init__, Scheduler.schedule

    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        transfer = self.vllm_config.kv_transfer_config
        self.kvmatrix_role = transfer.kv_role if transfer is not None else "engine"
        self.kvmatrix_lookup = self.dynamic_sd_lookup
        if self.vllm_config.speculative_config is not None and self.vllm_config.speculative_config.method == "ngram":
            trace_ngram(self.kvmatrix_role)

    def traced_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.kvmatrix_lookup is None and self.num_spec_tokens:
            off = os.path.exists(os.environ[SWITCH_ENV])
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (self.scheduler_config.max_num_seqs + 1) if off else None
        out = schedule(self, *args, **kwargs)
        steps = {rid: {"computed": self.requests[rid].num_computed_tokens - n, "scheduled": n,
                       "prompt": self.requests[rid].num_prompt_tokens,
                       "drafts": list(out.scheduled_spec_decode_tokens.get(rid, []))}
                 for rid, n in out.num_scheduled_tokens.items()}
        if steps:
            log({"role": self.kvmatrix_role, "event": "schedule", "requests": steps})
        return out

    Scheduler.__init__, Scheduler.schedule = traced_init, traced_schedule


def main() -> int:
    if sys.argv[1:2] != ["child"]:
        raise SystemExit("usage: spec_padding.py child (the harness's child, traced)")
    trace()
    return child.main()


if __name__ == "__main__":
    sys.exit(main())
