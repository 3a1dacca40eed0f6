"""logprobs: each golden token's logprob matches golden within the dtype's (or the declared) tolerance."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, first_divergence, tolerances_script, verdict
from harness.results.rows import Verdict
from reference_impl.request import RequestOutput


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "the logprob of a golden token differs from golden's by more than the dtype's tolerance (or the one declared "
    "for a lossy level), at every step up to the first divergence and at that divergence too (the cell's logprob of "
    "golden's token, from its top-k) unless it is a tie"
)

def _golden_token_logprob(out: RequestOutput, want: RequestOutput, step: int) -> float | None:
    """The cell's logprob of the golden token at ``step``, read from its top-k; None when not among them."""
    for token, logprob in zip(out.top_ids[step], out.top_logprobs[step]):
        if token == want.tokens[step]:
            return logprob
    return None


def judge(views: Sequence[PassView]) -> Verdict:
    """Logprobs of the golden tokens match golden within the dtype's tolerance, up to the first divergence.

    At a divergence that is not a tie, the cell's logprob of the token golden chose (from its top-k)
    is compared too: damage that flips the very first decoded token shows here, not only in ``tokens``. A request
    is judged up to its first finding no declaration excuses; an excused one does not end it. Where the engine says
    which of a reply's tokens a verify step emitted (``PassResult.verified``), each finding says so (``token``:
    "drafted", a draft the target accepted or the token it sampled after them; else "sampled"), so that a
    declaration can excuse the drafted tokens' alone.
    """
    findings = []
    worst = 0.0
    for view in views:
        golden = {o.rid: o for o in view.golden}
        tol = view.logprob_tol()
        for out in view.outputs:
            want = golden.get(out.rid)
            if want is None:
                continue
            drafted = view.got.verified.get(out.rid)
            stop = first_divergence(out.tokens, want.tokens)
            steps = [(s, out.logprobs[s]) for s in range(min(len(out.logprobs), len(want.logprobs)) if stop is None else stop)]
            if stop is not None and want.margins[stop] >= view.tie():
                steps.append((stop, _golden_token_logprob(out, want, stop)))
            for step, got in steps:
                delta = float("inf") if got is None else abs(got - want.logprobs[step])
                finding = {**view.where(), "request": out.rid, "step": step, "expected": want.logprobs[step],
                           "got": got, "delta": delta, "tolerance": tol,
                           **({} if drafted is None else {"token": "drafted" if step in drafted else "sampled"})}
                if delta <= tol:
                    worst = max(worst, delta)
                elif view.excused("logprobs", finding):
                    findings.append(finding)  # excused as declared: the steps after it are still judged
                else:
                    worst = max(worst, delta if delta == delta else float("inf"))
                    findings.append(finding)
                    break
    return verdict("logprobs", findings, f"max |Δ logprob| {worst:.2e}",
                   lambda f: f"{len(f)} request(s) off by more than {f[0]['tolerance']}; first: {f[0]['request']} "
                             f"step {f[0]['step']}: Δ {f[0]['delta']:.3g}", views)


#: shown bit for bit (expected and got logprob); a script holds to the run's tolerances.
ORACLE = Oracle("logprobs", FAILS_WHEN, judge, evidence="bits", script=tolerances_script)
