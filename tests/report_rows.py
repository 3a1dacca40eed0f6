"""Synthetic results rows for report tests and the report benchmark: realistic shapes, known causes, no engine.

Cells of a nightly-like factor set fail by rules with known triggers (the located combinations a
report must name), and carry the evidence each oracle writes (token windows, tier splits,
accept-length histograms, a NaN logprob), so the page's every view has something to draw.
"""
from __future__ import annotations

import itertools
import random

FACTORS = {
    "model": ["dense", "hybrid"], "cache": ["off", "device", "host"], "scheduler": ["fcfs", "priority"],
    "page_size": [1, 16], "pool": ["static", "unified"], "backend": ["torch", "triton"],
    "deterministic": ["off", "on"], "spec": ["none", "ngram", "draft", "mtp"], "poison": ["off", "on"],
    "prefill_budget": [16, 32, 64, 128],
}
#: failure class → trigger; each cell having every listed level fails that way.
RULES = {
    "tokens": {"pool": "unified", "backend": "triton", "deterministic": "on"},
    "completeness": {"scheduler": "priority", "cache": "device"},
    "accept_length": {"spec": "draft", "cache": "host"},
    "error": {"spec": "mtp", "model": "hybrid"},
}
ORACLES = ("tokens", "logprobs", "nan", "accept_length", "cached_tokens", "batch_invariance", "completeness", "pool_audit")


def _evidence(oracle: str, rng: random.Random) -> tuple[str, list[dict]]:
    step = rng.randrange(20, 40)
    golden = [rng.randrange(256) for _ in range(64)]
    got = golden[:step] + [(t + 1) % 256 for t in golden[step:]]
    where = {"workload": "system_prompt", "pass": "warm", "request": f"sp-{rng.randrange(8)}", "step": step}
    if oracle == "tokens":
        return (f"1 request(s) diverge from golden; first: system_prompt/warm step {step}",
                [{**where, "expected": golden[step], "got": got[step], "golden_margin": 0.42, "window_start": step - 16,
                  "expected_tokens": golden[step - 16: step + 32], "got_tokens": got[step - 16: step + 32]}])
    if oracle == "accept_length":
        return ("1 pass(es) off; first: system_prompt/warm vs golden: mean accept length 1.6 (expected 3.1, max 4)",
                [{**where, "against": "golden", "expected": 3.1, "got": 1.6, "max": 4, "histogram": {"1": 30, "2": 9, "4": 3},
                  "expected_histogram": {"1": 3, "3": 8, "4": 31}, "movers": [{"request": "sp-1", "drop": 1.9}]}])
    return ("16 problem(s); first: burst/cold burst-1 never finished (lost)",
            [{"workload": "burst", "pass": "cold", "request": "burst-1", "problem": "never finished (lost)"}])


def row(factors: dict, rng: random.Random, matrix: str = "synthetic", run_id: str = "run0") -> dict:
    """One cell's row: failing the oracles whose rule its levels match, with evidence, or an IndexError."""
    oracles = {name: {"verdict": "pass", "message": "as expected", "detail": []} for name in ORACLES}
    failing = [name for name, rule in RULES.items() if all(factors[f] == v for f, v in rule.items())]
    status, error = "pass", None
    if "error" in failing:
        status, error, oracles = "error", "Traceback (most recent call last):\nIndexError: list index out of range", {}
    else:
        for name in failing:
            message, detail = _evidence(name, rng)
            oracles[name] = {"verdict": "fail", "message": message, "detail": detail}
            status = "fail"
    return {"cell_id": "-".join(f"{f}:{v}" for f, v in factors.items()), "matrix": matrix, "factors": dict(factors),
            "status": status, "oracles": oracles, "faults": [], "error": error, "run_id": run_id, "device": "cpu",
            "metrics": {"wall_seconds": round(rng.uniform(1, 90), 2), "engine_seconds": round(rng.uniform(1, 80), 2),
                        "mean_accept_length": round(rng.uniform(1.5, 3.2), 4) if factors["spec"] != "none" else None,
                        "cached_tokens_warm": rng.randrange(0, 2000),
                        "cached_tokens_warm_by_tier": {"device": 100, "host": 0, "storage": 0}}}


def rows(n: int | None = None, seed: int = 0) -> list[dict]:
    """The full product of FACTORS (6,144 cells), or ``n`` of them drawn with ``seed``, in product order."""
    rng = random.Random(seed)
    product = [dict(zip(FACTORS, levels)) for levels in itertools.product(*FACTORS.values())]
    chosen = sorted(rng.sample(range(len(product)), n)) if n is not None else range(len(product))
    return [row(product[i], rng) for i in chosen]


def header(run_id: str = "run0", **changes: object) -> dict:
    """A run header as runs.jsonl holds it."""
    return {"run_id": run_id, "matrix": "synthetic", "matrix_arg": "synthetic", "matrix_file": "matrices/synthetic.toml",
            "matrix_sha256": "0" * 64, "mode": "full", "strength": None, "faults": [], "device": "cpu",
            "device_name": "CPU (x86_64)", "shard": None, "cells_planned": 0, "commit": "abc123", "date": "2026-11-30T00:00:00+00:00",
            "host": "ci-1", "versions": {"python": "3.11.7", "torch": "2.13.0", "triton": "3.7.1"},
            "command": "python -m harness run --matrix synthetic", **changes}
