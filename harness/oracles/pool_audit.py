"""pool_audit: the idle engine's pools, slots and cache are consistent (no leak, no double owner, no freed read); on
vLLM, its block pool against its scheduler after every step (``harness/sut/vllm/audit.py``)."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "after a pass, pages or state slots leaked or have two owners, a freed page was read, or a kernel's 32-bit "
    "offset arithmetic would wrap at a 24 GiB KV budget; PD cells audit both engines, the staging ring and the "
    "metadata slots, and that no transfer or parked request is left; on vLLM (audit = on), after any engine step a "
    "block's references differ from the block tables holding it, the free queue from the unheld blocks, a cached hash "
    "from its block, a request's computed tokens exceed its blocks or count a hit its blocks do not hold, or a running "
    "request the step could serve was skipped (both PD engines audited)"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """No page or state slot leaked or doubly owned when idle, and no freed page read; a real engine's own audit
    (vLLM's child, after every step) found nothing."""
    if not any(v.traits.audited for v in views):
        return Verdict("pool_audit", "skip", "the engine under test reports no pool audit")
    findings = [{**v.where(), "problem": p} for v in views for p in v.got.audit]
    return verdict("pool_audit", findings, "pools and cache consistent" + _steps(views),
                   lambda f: f"{len(f)} problem(s); first: {f[0]['workload']}/{f[0]['pass']}: {f[0]['problem']}", views)


def _steps(views: Sequence[PassView]) -> str:
    """How the engine audited: when idle (the reference), or after each of so many steps (a real engine's count)."""
    steps = sum(v.got.counters.get("audited_steps", 0) for v in views)
    return f" after each of {steps} engine steps" if steps else " when idle"


ORACLE = Oracle("pool_audit", FAILS_WHEN, judge)
