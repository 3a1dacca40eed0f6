"""Run with vLLM's interpreter by test_draft_state.py: the harness's child (``harness/sut/vllm/child.py``) serves one
workload three times on one engine with prefix caching, and before the third pass the draft's KV cache is overwritten
with seeded noise ten times the spread of its own keys and values (garbage, as slots nobody restored may hold), the
target's left whole: a stale draft state, what a tier that restores the target's KV and not the draft's leaves in the
draft's slots (SGLang #30393's shape). Reads ``{"engine_args", "serve"}`` on stdin, prints the three answers as
JSON."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "harness" / "sut" / "vllm"))
import child  # noqa: E402  (the child imports only the standard library, vllm and torch)

#: the noise's spread, in units of the draft's own keys and values: at 1 it moved 0 or 1 accepted token of 18 to 36
#: (system_prompt, multi_turn, long_prompts; 2026-12-02), these models' drafts leaning on the current token more than
#: on distant context; at 10 the loss is plain.
SCALE = 10.0


def stale_draft_kv(worker: Any) -> int:
    """Overwrite the KV cache of every attention layer the proposer owns with seeded Gaussian noise, ``SCALE`` times
    the spread of the layer's written keys and values; how many layers that was."""
    import torch

    runner, generator = worker.model_runner, torch.Generator().manual_seed(0)
    layers = runner.vllm_config.compilation_config.static_forward_context
    for name in sorted(runner.drafter._draft_attn_layer_names):
        cache = layers[name].kv_cache
        for tensor in cache if isinstance(cache, list) else [cache]:
            written = tensor[tensor != 0]
            scale = float(written.std()) if written.numel() > 1 else 1.0
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * scale * SCALE)
    return len(runner.drafter._draft_attn_layer_names)


def main() -> int:
    msg = json.loads(sys.stdin.read())
    engine = child.Child()
    engine.start({"engine_args": msg["engine_args"]})
    serve = msg["serve"]  # harness.sut.vllm.protocol.serve_message
    cold, warm = engine.serve(serve), engine.serve(serve)
    staled = engine.llm.collective_rpc(stale_draft_kv)
    print(json.dumps({"cold": cold, "warm": warm, "stale_layers": staled, "stale": engine.serve(serve)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
