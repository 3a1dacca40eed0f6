"""What a script's check needs, taken from the harness's own judgement of the failing run on the shrunk workload:
the passes the check failed in, the requested lengths, the tie and logprob tolerances the oracles used, the cached
tokens the engine's cache rule allows, the accept-length bounds, the prompt tokens a PD decode side computes itself.
Plain values: the script carries them as they are."""
from __future__ import annotations

from harness.oracles.accept_length import ACCEPT_TOLERANCE
from harness.repro.finding import Reproducer
from harness.run.judge import expected_cached, pass_views

#: the passes a script serves (isolation passes and the requests alone are the harness's).
SCRIPT_PASSES = ("cold", "warm")


def check_spec(repro: Reproducer) -> dict:
    """``CHECK`` of ``repro``'s script (``harness.repro.standalone.checks``)."""
    check, workload = repro.check, repro.shrunk.workload
    passes = [p for p in dict.fromkeys(f.get("pass") for f in check.findings(repro.failing)) if p in SCRIPT_PASSES]
    spec: dict = {"oracle": check.oracle, "check": check.check, "passes": passes or list(SCRIPT_PASSES),
                  "requested": {r.rid: r.max_new_tokens for r in workload.requests}}
    run = repro.failing.run
    if run is None:  # the run raised: the error check needs nothing more
        return spec
    view = pass_views(run, {}, repro.plan.tolerances)[0]
    if check.oracle in ("tokens", "logprobs"):
        spec.update(tie=view.tie(), tolerance=view.logprob_tol())
    if check.oracle == "cached_tokens":
        spec["cached"] = {name: {rid: _allowed(e) for rid, e in expected_cached(run, name).items()}
                          for name in spec["passes"]}
    if check.oracle == "accept_length":
        spec["accept"] = {"max": run.traits.spec.max_accept_length, "tolerance": ACCEPT_TOLERANCE}
    if check.oracle == "pd_audit":
        spec["backoff"] = next(p.pd["backoff"] for p in run.passes.values() if p.pd is not None)
    return spec


def _allowed(expectation) -> dict:
    """A ``CachedExpectation`` as the script's check reads it."""
    allowed = {"values": list(expectation.values)} if expectation.values is not None else {
        "lo": expectation.lo, "hi": expectation.hi, "page": expectation.page_size}
    return {**allowed, "host": expectation.host, "storage": expectation.storage, "text": expectation.describe()}
