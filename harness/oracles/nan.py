"""nan: no NaN or Inf anywhere the engine reports (logits, attention outputs, Mamba states, returned logprobs)."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a NaN/Inf appears in logits, an attention output, a Mamba state or a returned logprob (always armed)"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """No NaN/Inf in logits, attention outputs or Mamba states, and every returned logprob finite."""
    findings = []
    for view in views:
        for event in view.got.nan_events:
            findings.append({**view.where(), "where": event.where, "step": event.step, "requests": event.rids})
        for out in view.outputs:
            bad = [i for i, lp in enumerate(out.logprobs) if not -float("inf") < lp < float("inf")]
            if bad:
                findings.append({**view.where(), "where": "logprobs", "request": out.rid, "step": bad[0]})
    return verdict("nan", findings, "no NaN/Inf seen",
                   lambda f: f"non-finite values: first in {f[0]['where']} ({f[0]['workload']}/{f[0]['pass']})", views)


ORACLE = Oracle("nan", FAILS_WHEN, judge)
