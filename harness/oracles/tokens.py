"""tokens: greedy tokens equal the golden run's, except where golden's top-2 margin at that step is a tie."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, first_divergence, tolerances_script, verdict, with_ties
from harness.results.rows import Verdict

#: tokens kept around a divergence (before, from it on), golden and cell alike: enough to see both
#: sequences side by side, bounded so a 5,000-cell report stays small.
TOKEN_WINDOW = (16, 32)


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a greedy token differs from the golden run, except where golden's top-2 logit margin at that step is below the "
    "tie tolerance (reported as a tie, not a failure)"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """Greedy tokens equal the golden run's, except at a near-tie of the golden top-2 logits."""
    findings, ties = [], []
    for view in views:
        golden = {o.rid: o for o in view.golden}
        for out in view.outputs:
            want = golden.get(out.rid)
            if want is None or not out.tokens:
                continue
            step = first_divergence(out.tokens, want.tokens)
            if step is None:
                continue
            start = max(0, step - TOKEN_WINDOW[0])
            where = {**view.where(), "request": out.rid, "step": step,
                     "expected": want.tokens[step], "got": out.tokens[step], "golden_margin": round(want.margins[step], 6),
                     "window_start": start, "expected_tokens": want.tokens[start : step + TOKEN_WINDOW[1]],
                     "got_tokens": out.tokens[start : step + TOKEN_WINDOW[1]]}
            (ties if want.margins[step] < view.tie() else findings).append(where)
    return with_ties(verdict(
        "tokens", findings, f"all tokens equal golden ({len(ties)} ties)",
        lambda f: f"{len(f)} request(s) diverge from golden; first: {f[0]['workload']}/{f[0]['pass']} "
                  f"{f[0]['request']} step {f[0]['step']}: expected {f[0]['expected']}, got {f[0]['got']}",
        views,
    ), ties)


#: shown as the two token sequences aligned, the first divergence marked; a script holds to the run's tolerances.
ORACLE = Oracle("tokens", FAILS_WHEN, judge, evidence="tokens", script=tolerances_script)
