"""Triton kernels under the CPU interpreter: milliseconds per launch with SGLang's launch shapes vs the interpreter's.

Side by side in one process, alternating, best of ``REPEATS``: each case is a batch the smoke
matrix's Triton cells launch (one attention layer). "GPU shapes" are what the interpreter ran
before it had shapes of its own (SGLang's, with 16 cores for the batch-dependent split count);
"interpreter shapes" are ``INTERPRETER_SHAPES``. Both compute the same bits for every extend and
for deterministic decode (tests/reference_impl/attention/test_triton_backend.py).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reference_impl.attention.triton_backend import TritonBackend  # noqa: E402
from reference_impl.attention.triton_ops.common import INTERPRETED, INTERPRETER_SHAPES, LaunchShapes  # noqa: E402
from tests.reference_impl.attention.test_triton_backend import Case  # noqa: E402

GPU_SHAPES = LaunchShapes(extend_block_m=16, kv_split_cores=16, merge_one_split=True)
REPEATS = 5
#: (kernel, deterministic, (prefix, new tokens) per request, what it stands for)
CASES = [
    ("decode", True, [(69, 1)] * 6, "6 requests at ~70 tokens (system_prompt's batch)"),
    ("decode", True, [(40, 1)], "1 request at 41 tokens, one split (the alone pass)"),
    ("decode", True, [(90, 1)], "1 request at 91 tokens, two splits (the alone pass)"),
    ("decode", False, [(90, 1)], "1 request at 91 tokens, batch-dependent splits (6 vs 2)"),
    ("extend_two_stage", False, [(0, 70), (48, 20)], "a 70-token prefill and a 20-token extend after a hit"),
    ("extend_unified", True, [(0, 70), (48, 20)], "the same, deterministic (unified single-stage)"),
    ("extend_unified", True, [(0, 120)], "a 120-token prefill"),
]


def best_ms(case: Case, backends: list[TritonBackend]) -> list[float]:
    """Best wall time of one forward per backend over ``REPEATS`` rounds (the backends in turn), after a warm-up."""
    for backend in backends:
        case.run(backend)
    best = [float("inf")] * len(backends)
    for _ in range(REPEATS):
        for i, backend in enumerate(backends):
            started = time.perf_counter()
            case.run(backend)
            best[i] = min(best[i], time.perf_counter() - started)
    return [b * 1000 for b in best]


def main() -> None:
    torch.set_num_threads(1)
    if not INTERPRETED:
        print("Triton compiles in this process (a GPU is present): nothing to measure for the interpreter")
        return
    print(f"{'kernel':17s} {'det':3s} {'GPU shapes ms':>13s} {'interp. ms':>10s} {'speed-up':>8s}  case")
    for kernel, deterministic, lens, what in CASES:
        case = Case(lens, 16, "cpu", decode=kernel == "decode", seed=3)
        times = best_ms(case, [TritonBackend(16, deterministic=deterministic, shapes=shapes)
                               for shapes in (GPU_SHAPES, INTERPRETER_SHAPES)])
        print(f"{kernel:17s} {'on' if deterministic else 'off':3s} {times[0]:13.1f} {times[1]:10.1f} "
              f"{times[0] / times[1]:7.2f}x  {what}", flush=True)


if __name__ == "__main__":
    main()
