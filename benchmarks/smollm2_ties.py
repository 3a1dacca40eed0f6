"""Ties on a trained model: how many golden decode steps of smollm2 (issue 31) are near-ties at each dtype, and how far
vLLM's golden (fp32 weights dequantized from the GGUF) and llama.cpp's (the Q4_1 GGUF as shipped) agree.

For each engine and level (vLLM: fp32, bf16; llama.cpp: f32 KV, f16 KV), the golden levels of its smollm2 matrix
with that level, on the four real-text workloads, cold pass: the share of steps whose golden top-2 logit margin is
under each tie tolerance (the oracles' defaults per dtype, ``harness.oracles.view.TIE_TOLERANCE``, and the matrices'
declared ones). Then, request by request, the first step where two configurations' greedy tokens differ and the
margin the first had there. Needs .venv-vllm, llama-server and the wheel; run it under the engines' lock:

    flock /tmp/kvmatrix-heavy.lock .venv/bin/python benchmarks/smollm2_ties.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.workloads import MODEL_BOUND  # noqa: E402
from harness import sut  # noqa: E402
from harness.matrix.file import load_matrix  # noqa: E402
from harness.run.golden import GoldenRuns, golden_key  # noqa: E402

#: (label, matrix, level over its golden levels)
CONFIGS = (("vLLM fp32", "smollm2_vllm", {}), ("vLLM bf16", "smollm2_vllm", {"dtype": "bfloat16"}),
           ("llama.cpp f32 KV", "smollm2_llamacpp", {}), ("llama.cpp f16 KV", "smollm2_llamacpp", {"kv_type": "f16"}))
THRESHOLDS = (1e-3, 0.02, 0.125)
#: pairs whose greedy tokens are compared: (first, second)
PAIRS = (("vLLM fp32", "vLLM bf16"), ("llama.cpp f32 KV", "llama.cpp f16 KV"), ("vLLM fp32", "llama.cpp f32 KV"))


def golden_outputs(matrix_name: str, override: dict) -> dict[str, object]:
    """rid → the cold pass's RequestOutput of the golden levels of ``matrix_name`` with ``override``, every workload."""
    matrix = load_matrix(matrix_name)
    engine = sut.engine(matrix.engine)
    levels = {**engine.levels.golden, **matrix.golden, "model": "smollm2", "num_draft_tokens": 3, **override}
    keys = [golden_key(levels, name, matrix.engine, matrix.engine_args) for name in MODEL_BOUND]
    runs = GoldenRuns()
    runs.prefetch(keys)
    return {o.rid: o for key in keys for o in runs.get(key).passes["cold"].outputs}


def main() -> None:
    outputs = {label: golden_outputs(matrix, override) for label, matrix, override in CONFIGS}
    print("| golden | steps | " + " | ".join(f"margin < {t:g}" for t in THRESHOLDS) + " | least margin |")
    print("| --- | --- | " + " | ".join("---" for _ in THRESHOLDS) + " | --- |")
    for label, outs in outputs.items():
        margins = [m for o in outs.values() for m in o.margins]
        shares = " | ".join(f"{sum(m < t for m in margins)} ({sum(m < t for m in margins) / len(margins):.1%})"
                            for t in THRESHOLDS)
        print(f"| {label} | {len(margins)} | {shares} | {min(margins):.4f} |")
    print()
    print("| first | second | requests equal | diverging: step, first's margin there |")
    print("| --- | --- | --- | --- |")
    for a, b in PAIRS:
        equal, diverging = 0, []
        for rid, one in outputs[a].items():
            other = outputs[b][rid].tokens
            step = next((i for i, (x, y) in enumerate(zip(one.tokens, other)) if x != y), None)
            if step is None:
                equal += 1
            else:
                diverging.append(f"{rid} @{step}: {one.margins[step]:.3f}")
        print(f"| {a} | {b} | {equal}/{len(outputs[a])} | {'; '.join(diverging) or '-'} |")


if __name__ == "__main__":
    main()
