"""What a script's check needs, taken from the harness's own judgement of the failing run on the shrunk workload:
the passes the check failed in and the requested lengths, then what the failing oracle's declaration says its script
needs (``Oracle.script``: the tie and logprob tolerances the oracles used, the cached tokens the engine's cache rule
allows, the accept-length bounds, the prompt tokens a PD decode side computes itself). Plain values: the script
carries them as they are."""
from __future__ import annotations

from harness import oracles
from harness.repro.finding import Reproducer
from harness.run.judge import pass_views

#: the passes a script serves (isolation passes and the requests alone are the harness's).
SCRIPT_PASSES = ("cold", "warm")


def check_spec(repro: Reproducer) -> dict:
    """``CHECK`` of ``repro``'s script (``harness.repro.standalone.checks``): the common keys, then what the failing
    check's oracle declares its script needs (``Oracle.script``)."""
    check, workload = repro.check, repro.shrunk.workload
    passes = [p for p in dict.fromkeys(f.get("pass") for f in check.findings(repro.failing)) if p in SCRIPT_PASSES]
    spec: dict = {"oracle": check.oracle, "check": check.check, "passes": passes or list(SCRIPT_PASSES),
                  "requested": {r.rid: r.max_new_tokens for r in workload.requests}}
    run = repro.failing.run
    if run is None:  # the run raised: the error check needs nothing more
        return spec
    declared = oracles.oracles().get(check.oracle)
    if declared is not None and declared.script is not None:
        spec.update(declared.script(pass_views(run, {}, repro.plan.tolerances), spec["passes"]))
    return spec
