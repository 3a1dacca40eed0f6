"""pressure: a cell sized to run short of KV memory reached that edge, by the engine's own counters.

A tight cell (vLLM's ``kv_capacity = tight``) exists to drive preemption, eviction and re-admission, where block
reference counting goes wrong (the seeds' scheduler bug); its tokens, completeness and cached tokens are judged by
the other oracles against an unpressured golden. If the engine never preempted a request, the cell tested nothing
of that and must not pass for it. Skipped where no cell presses.
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict

#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a cell sized to run short of KV memory (`kv_capacity = tight`) never made the engine preempt a request, by its "
    "own counters: the edge it exists for was not reached; skipped where the cell does not press"
)


def judge(views: Sequence[PassView]) -> Verdict:
    """The engine preempted at least once over the cell's passes; each workload's preemptions and evictions shown."""
    pressed = [v for v in views if v.traits.pressed]
    if not pressed:
        return Verdict("pressure", "skip", "the cell does not press KV memory")
    by_workload: dict[str, list[int]] = {}
    for view in pressed:
        counted = by_workload.setdefault(view.workload, [0, 0])
        counted[0] += view.got.counters.get("preemptions", 0)
        counted[1] += view.got.counters.get("evicted_blocks", 0)
    shown = ", ".join(f"{w} {p} preempted / {e} evicted" for w, (p, e) in by_workload.items())
    findings = [] if any(p for p, _ in by_workload.values()) else [
        {"workload": "every workload", "pass": "every pass", "expected": "> 0 preemptions", "got": 0}]
    return verdict("pressure", findings, shown,
                   lambda f: f"the cell presses KV memory and the engine preempted no request ({shown})", views)


ORACLE = Oracle("pressure", FAILS_WHEN, judge)
