"""The row stage: a judged cell's record (``CellResult``): its status, its verdicts, and the metrics of its runs:
wall time and where it went, accept length, cached tokens, what crossed between PD engines."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.accept_length import pass_accept_length
from harness.results.rows import CellResult, Verdict
from harness.run.plan import CellPlan
from harness.run.serve import WorkloadRun
from reference_impl.request import TIERS
from reference_impl.spec.verify import outputs_accept_stats


def cell_row(plan: CellPlan, verdicts: dict[str, Verdict], runs: list[WorkloadRun], own_runs: list[WorkloadRun],
             wall: float, golden_seconds: float) -> CellResult:
    """The row of a cell that ran to its verdicts; a declared known failure settles it (``xfail``, ``xpass``)."""
    result = plan.result()
    result.oracles = verdicts
    result.status = "fail" if any(v.status == "fail" for v in verdicts.values()) else "pass"
    result.metrics = {**metrics(runs, own_runs, wall, golden_seconds), "workloads": list(plan.workloads)}
    if plan.tolerances:
        result.metrics["tolerances"] = dict(plan.tolerances)
    return result.settle()


def error_result(result: CellResult, error: str, wall: float) -> CellResult:
    """``result`` turned into an ``error`` row carrying ``error`` (a traceback or what killed the cell)."""
    result.status = "error"
    result.error = error
    result.oracles = {}
    result.metrics = {"wall_seconds": round(wall, 4)}
    return result.settle()


def metrics(runs: list[WorkloadRun], own_runs: list[WorkloadRun], wall: float, golden_seconds: float) -> dict[str, object]:
    """What a cell's row measures: ``runs`` every workload run it was judged on, ``own_runs`` those it served itself
    (a golden cell reuses the golden runs)."""
    engine = sum(r.seconds for r in own_runs)
    generated = sum(len(o.tokens) for r in own_runs for p in r.passes.values() for o in p.outputs)
    return {
        "wall_seconds": round(wall, 4),
        "engine_seconds": round(engine, 4),
        "golden_seconds": round(golden_seconds, 4),
        "harness_seconds": round(max(wall - engine - golden_seconds, 0.0), 4),
        "tokens_per_s": round(generated / engine, 1) if engine else None,
        "cached_tokens_warm": sum(o.cached_tokens for r in runs for o in r.passes["warm"].outputs),
        "cached_tokens_warm_by_tier": {
            tier: sum(o.cached_by_tier()[tier] for r in runs for o in r.passes["warm"].outputs) for tier in TIERS
        },
        "cached_tokens_cold": sum(o.cached_tokens for r in runs for o in r.passes["cold"].outputs),
        "preemptions": _stat(runs, "preemptions"),
        "evicted_blocks": _stat(runs, "evicted_blocks"),
        "placeholder_drafts": _stat(runs, "placeholder_drafts"),
        "placeholder_tokens": _stat(runs, "placeholder_tokens"),
        **_spec_metrics(runs),
        **_pd_metrics(runs),
        **_inside_metrics(runs),
        "golden_reused": len(own_runs) < len(runs),
        **_server_logs(own_runs),
        **_applied(runs),
        **{f"engine_{what}_seconds": round(sum(r.totals.seconds.get(what, 0.0) for r in own_runs), 4)
           for what in sorted({what for r in own_runs for what in r.totals.seconds})},
    }


def _server_logs(runs: list[WorkloadRun]) -> dict[str, object]:
    """A server cell: the output files its servers wrote, each once (absent for an engine that keeps none)."""
    logs = list(dict.fromkeys(log for r in runs for log in r.totals.logs))
    return {"server_logs": logs} if logs else {}


def _applied(runs: list[WorkloadRun]) -> dict[str, object]:
    """What the engine reports it applied (absent where it reports nothing): each setting's value as used, and every
    change from what the cell asked, as "what: asked X, engine used Y"."""
    settings = list(dict.fromkeys(s for r in runs for s in r.traits.applied))
    if not settings:
        return {}
    return {"applied": {s.what: s.used for s in settings},
            "applied_changes": [s.describe() for s in settings if s.changed]}


def _pd_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """PD cells: what crossed (summed over workloads), the move gate's refusals and each side's verify scratch."""
    counters = [r.totals.pd for r in runs if r.totals.pd is not None]
    if not counters:
        return {}
    summed = {key: sum(c[key] for c in counters) for key, value in counters[0].items() if isinstance(value, int)}
    if not all("verify_scratch_bytes" in c for c in counters):  # an engine that counts no verify scratch
        return {"pd": summed}
    scratch = {side: max(c["verify_scratch_bytes"][side] for c in counters) for side in ("prefill", "decode")}
    return {"pd": {**summed, "verify_scratch_bytes": scratch}}


def _inside_metrics(runs: list[WorkloadRun]) -> dict[str, object]:
    """A real engine audited or poisoned from inside (vLLM's child): the steps audited and the problems found, per
    workload and pass, and the blocks poisoned (absent where neither is on)."""
    passes = [p.counters for r in runs for p in r.passes.values()]
    out: dict[str, object] = {}
    if any("audited_steps" in c for c in passes):
        out["pool_audit"] = {"steps": sum(c.get("audited_steps", 0) for c in passes),
                             "problems": {r.workload.name: {name: p.counters.get("audit_problems", 0)
                                                            for name, p in r.passes.items()} for r in runs}}
    if any("poisoned_issued" in c for c in passes):
        out["poisoned_blocks"] = {what: sum(c.get(f"poisoned_{what}", 0) for c in passes) for what in ("issued", "freed")}
    return out


def _stat(runs: list[WorkloadRun], name: str) -> int | None:
    """An engine counter summed over the runs; None when the engine does not count it (a real engine)."""
    counted = [r.totals.stats[name] for r in runs if name in r.totals.stats]
    return sum(counted) if counted else None


def _spec_metrics(runs: Sequence[WorkloadRun]) -> dict[str, object]:
    """Accept length over both passes of every workload, decode tokens per target forward, draft-state hits.

    A pass-counted engine's mean is 1 + accepted / drafts over all its passes (vLLM's definition); each pass's own
    mean, by workload, is what a measured band (``fixtures.spec_expect.accept_band``) is read from."""
    if runs and runs[0].traits.spec.pass_counted:
        counters = [p.counters for r in runs for p in r.passes.values()]
        drafts, accepted = (sum(c.get(key, 0) for c in counters) for key in ("drafts", "accepted_tokens"))
        mean = round(pass_accept_length({"drafts": drafts, "accepted_tokens": accepted}), 4) if drafts else None
        by_pass = {r.workload.name: {name: round(pass_accept_length(p.counters), 4) for name, p in r.passes.items()}
                   for r in runs}
        return {"mean_accept_length": mean, "accept": {"drafts": drafts, "accepted_tokens": accepted,
                                                       "draft_tokens": sum(c.get("draft_tokens", 0) for c in counters),
                                                       "passes": by_pass}}
    stats = outputs_accept_stats([o for r in runs for p in r.passes.values() for o in p.outputs])
    forwards, emitted = _stat(runs, "decode_forwards"), _stat(runs, "emitted_tokens")
    return {
        "mean_accept_length": stats.to_json()["mean_accept_length"],
        "accept": stats.to_json(),
        "decode_tokens_per_forward": round(emitted / forwards, 4) if forwards else None,
        "draft_full_hits": _stat(runs, "draft_full_hits"),
        "draft_partial_hits": _stat(runs, "draft_partial_hits"),
    }
