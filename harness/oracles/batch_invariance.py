"""batch_invariance: in deterministic mode a request's logits are bitwise the same alone as in its batch, and
warm as cold."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict
from reference_impl.request import RequestOutput


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "deterministic mode only: a request's logprobs, top-2 margins or top-k differ in any bit between running alone "
    "and in the full batch, or between its cold and warm (cache-hit) pass"
)

def _bitwise_difference(got: RequestOutput, want: RequestOutput) -> dict | None:
    """First step where the two runs' logits (seen through logprobs and margins) differ in any bit."""
    for step in range(min(len(got.tokens), len(want.tokens))):
        pairs = (("token", got.tokens[step], want.tokens[step]), ("logprob", got.logprobs[step], want.logprobs[step]),
                 ("margin", got.margins[step], want.margins[step]),
                 ("top_logprobs", got.top_logprobs[step], want.top_logprobs[step]))
        for what, a, b in pairs:
            if a != b:
                return {"step": step, "what": what, "expected": b, "got": a}
    return None


def _against(view: PassView) -> str:
    """The reference a pass is held to: each request alone for the cold pass, the cold pass for every later one."""
    return "solo" if view.name == "cold" else "cold"


def judge(views: Sequence[PassView]) -> Verdict:
    """Deterministic mode: a request's logits are bitwise equal alone vs in the batch, and cold vs warm.

    A hybrid request that was preempted is exempt: its recompute replays decoded tokens
    through the chunked SSD scan instead of the recurrent step, which no engine makes bitwise.
    """
    findings, checked, exempt = [], 0, 0
    armed = [v for v in views if v.traits.deterministic and v.reference(_against(v)) is not None]
    for view in armed:
        reference = {o.rid: o for o in view.reference(_against(view))}
        for out in view.outputs:
            want = reference.get(out.rid)
            if want is None or out.finish_reason != "length":
                continue
            if view.traits.hybrid and (out.preemptions or want.preemptions):
                exempt += 1
                continue
            checked += 1
            diff = _bitwise_difference(out, want)
            if diff:
                findings.append({**view.where(), "against": _against(view), "request": out.rid, **diff})
    if not armed:
        return Verdict("batch_invariance", "skip", "deterministic mode is off")
    return verdict("batch_invariance", findings, f"{checked} requests bitwise invariant ({exempt} preempted, exempt)",
                   lambda f: f"{len(f)} request(s) not bitwise invariant; first: {f[0]['workload']}/{f[0]['pass']} "
                             f"vs {f[0]['against']} {f[0]['request']} step {f[0]['step']} ({f[0]['what']})",
                   views)


#: shown bit for bit: batched and alone differ by a few ULPs, where a table would round the difference away.
ORACLE = Oracle("batch_invariance", FAILS_WHEN, judge, evidence="bits")
