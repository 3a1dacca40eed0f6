"""What the reference engine would cost on the trained model (issue 31): a seeded model of SmolLM2-135M's shape (30
attention layers, hidden 576, 9 query / 3 KV heads of 64, ffn 1536, vocab 49,152) through the reference engine, the
cold pass of each real-text workload, cache off, page 32, with the batch-invariant kernels off and on (the reference's
golden levels have them on). The weights are seeded, not SmolLM2's: the cost of a forward is the shape's.

    flock /tmp/kvmatrix-heavy.lock .venv/bin/python benchmarks/smollm2_reference_cost.py
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.workloads import MODEL_BOUND, load_workload  # noqa: E402
from harness.sut.reference.engine import build_engine_config, make_engine  # noqa: E402
from reference_impl.config import ModelConfig  # noqa: E402

SHAPE = ModelConfig(name="smollm2_shape", layer_types=("attention",) * 30, vocab_size=49152, hidden=576, num_heads=9,
                    num_kv_heads=3, head_dim=64, ffn=1536, rope_theta=100000.0, rms_eps=1e-5)


def main() -> None:
    """Print the seconds of each workload's cold pass, deterministic off and on."""
    for deterministic in ("off", "on"):
        for name in MODEL_BOUND:
            workload = load_workload(name)
            levels = {"model": "dense", "cache": "off", "page_size": 32, "deterministic": deterministic}
            engine = make_engine(dataclasses.replace(build_engine_config(levels, workload, frozenset()), model=SHAPE))
            start = time.perf_counter()
            outputs = engine.generate(list(workload.requests))
            seconds = time.perf_counter() - start
            prompt = sum(len(r.prompt) for r in workload.requests)
            print(f"deterministic {deterministic}: {name}: {len(outputs)} requests, {prompt} prompt + "
                  f"{sum(len(o.tokens) for o in outputs)} generated tokens in {seconds:.1f} s")
            engine.close()


if __name__ == "__main__":
    main()
