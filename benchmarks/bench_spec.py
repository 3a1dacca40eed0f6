"""Speculative decoding on CPU: decode tokens per target forward, with and without each proposer.

A target forward here is one request's decode step (a plain decode or a verify step); the
figure is what speculation buys in target passes. Mean accept length counts verify steps only.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures.workloads import MODEL_BOUND, WORKLOADS as ALL_WORKLOADS  # noqa: E402
from fixtures.workloads import load_workload  # noqa: E402
from harness.run.cell import configure_torch  # noqa: E402
from harness.run.serve import run_workload  # noqa: E402
from reference_impl.spec.verify import outputs_accept_stats  # noqa: E402

WORKLOADS = ("system_prompt", "multi_turn", "long_prompts", "burst")
SPECS = ("none", "ngram", "draft", "mtp")


def measure(model: str, spec: str) -> dict[str, float | None]:
    """Every default workload cold then warm (cache on, k = 3): decode efficiency and accept length."""
    emitted = forwards = 0
    outputs, seconds = [], 0.0
    for name in WORKLOADS:
        levels = {"model": model, "spec": spec, "cache": "device", "page_size": 16}
        started = time.perf_counter()
        run = run_workload(levels, load_workload(name), frozenset())
        seconds += time.perf_counter() - started
        emitted += run.stats.emitted_tokens
        forwards += run.stats.decode_forwards
        outputs += [o for p in run.passes.values() for o in p.outputs]
    stats = outputs_accept_stats(outputs)
    return {"tokens_per_forward": emitted / forwards, "accept": stats.mean_accept_length,
            "rate": stats.acceptance_rate, "seconds": seconds}


#: the configurations an accept band must hold across: golden levels, the cache on the unified pool, non-deterministic.
BAND_LEVELS = ({}, {"cache": "device", "page_size": 16, "pool": "unified"},
               {"cache": "device", "page_size": 16, "deterministic": "off"})


#: workloads without a band (which requests are preempted moves with the configuration): fixtures/spec_expect.py
UNBANDED = ("burst", "spec_preempt")


def bands(k: int = 3) -> None:
    """Per workload, model and proposer: the lowest and highest mean accept length of a pass at ``k`` draft tokens
    (requests never preempted, as the oracle counts them), as a Python table."""
    print(f"    {k}: {{")
    for name in ALL_WORKLOADS:
        if name in UNBANDED or name in MODEL_BOUND:
            continue
        for model in ("dense", "hybrid"):
            for spec in SPECS[1:]:
                means = []
                for levels in BAND_LEVELS:
                    run = run_workload({"model": model, "spec": spec, "num_draft_tokens": k, **levels},
                                       load_workload(name), frozenset())
                    kept = [[o for o in p.outputs if not o.preemptions] for p in run.passes.values()]
                    means += [outputs_accept_stats(outs).mean_accept_length or 1.0 for outs in kept]
                print(f"        ({name!r}, {model!r}, {spec!r}): ({min(means):.4f}, {max(means):.4f}),", flush=True)
    print("    },")


def main() -> None:
    configure_torch()
    if "--bands" in sys.argv:  # --bands [K ...]: the table of each k (default 3)
        for k in [int(a) for a in sys.argv[sys.argv.index("--bands") + 1:]] or [3]:
            bands(k)
        return
    print("decode tokens per target forward (4 workloads, cold + warm, cache=device, page 16, k=3):")
    print("| model | spec | tokens / target forward | mean accept length | acceptance rate | engine s |")
    print("|---|---|---|---|---|---|")
    for model in ("dense", "hybrid"):
        for spec in SPECS:
            m = measure(model, spec)
            accept = "—" if m["accept"] is None else f"{m['accept']:.2f}"
            rate = "—" if m["rate"] is None else f"{m['rate']:.2f}"
            print(f"| {model} | {spec} | {m['tokens_per_forward']:.2f} | {accept} | {rate} | {m['seconds']:.1f} |")


if __name__ == "__main__":
    main()
