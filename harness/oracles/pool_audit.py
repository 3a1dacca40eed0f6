"""pool_audit: the idle engine's pools, slots and cache are consistent (no leak, no double owner, no freed read)."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "after a pass, pages or state slots leaked or have two owners, a freed page was read, or a kernel's 32-bit "
    "offset arithmetic would wrap at a 24 GiB KV budget; PD cells audit both engines, the staging ring and the "
    "metadata slots, and that no transfer or parked request is left"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """No page or state slot leaked or doubly owned when idle, and no freed page read."""
    if not any(v.traits.audited for v in views):
        return Verdict("pool_audit", "skip", "the engine under test reports no pool audit")
    findings = [{**v.where(), "problem": p} for v in views for p in v.got.audit]
    return verdict("pool_audit", findings, "pools and cache consistent when idle",
                   lambda f: f"{len(f)} problem(s); first: {f[0]['workload']}/{f[0]['pass']}: {f[0]['problem']}", views)


ORACLE = Oracle("pool_audit", FAILS_WHEN, judge)
