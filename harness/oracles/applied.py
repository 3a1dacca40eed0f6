"""applied: a setting the engine changed from what the cell asked (read back from it) must not defeat its purpose.

An engine may apply a level other than the one asked, silently: a slot count, a block size, a KV layout, a proposer
it dropped. The engine's package reads back what it applied (``Traits.applied``) and says, for each change, whether it
defeats what the cell tests; the row shows every change ("asked 4, engine used 1"), this oracle fails on the ones that
defeat it. Skipped where the engine reads nothing back (the reference applies every level as asked).
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict

#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "the engine applied a setting other than the one the cell asked for, read back from it (a slot count, a KV "
    "layout, a proposer it dropped), and the change defeats what the cell tests (a change the engine's own documented "
    "rule makes is shown with its citation, not failed); skipped where nothing is read back"
)


def judge(views: Sequence[PassView]) -> Verdict:
    """Every change the engine reports that defeats the cell's purpose is a finding; the harmless ones are shown."""
    seen: dict[str, object] = {}
    for view in views:
        for setting in view.traits.applied:
            seen.setdefault(setting.describe(), setting)
    if not seen:
        return Verdict("applied", "skip", "the engine reads back nothing it applied")
    findings = [{"setting": s.what, "expected": s.asked, "got": s.used, "defeats": s.defeats}
                for s in seen.values() if s.changed and s.defeats]
    changed = [text for text, s in seen.items() if s.changed]
    ok = f"as asked, except {'; '.join(changed)}" if changed else f"as asked ({len(seen)} settings read back)"
    return verdict("applied", findings, ok,
                   lambda f: f"{f[0]['setting']}: asked {f[0]['expected']}, engine used {f[0]['got']}: "
                             f"{f[0]['defeats']}", views)


ORACLE = Oracle("applied", FAILS_WHEN, judge)
