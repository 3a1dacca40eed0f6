"""cross_engine: a real engine's golden run agrees token for token with another engine's golden on the same weights
(the reference engine serving the checkpoint it was exported from), except at the other engine's ties."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.oracles.view import TIE_TOLERANCE, Oracle, PassView, first_divergence, verdict, with_ties
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a real engine's golden token differs from the reference engine's golden on the same weights, except at a tie "
    "of the reference's top-2 margin; skipped where no second engine serves the model"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """The cell's golden run agrees token for token with another engine's golden on the same weights, except where
    the other engine's top-2 margin is a tie."""
    armed = [v for v in views if "cross_engine" in v.references and v.name == "cold"]
    if not armed:
        return Verdict("cross_engine", "skip", "no second engine serves this model")
    findings, ties, compared = [], [], 0
    for view in armed:
        other = {o.rid: o for o in view.reference("cross_engine")}
        for out in view.golden:
            want = other.get(out.rid)
            if want is None or not out.tokens:
                continue
            compared += 1
            step = first_divergence(out.tokens, want.tokens)
            if step is None:
                continue
            where = {"workload": view.workload, "request": out.rid, "step": step, "expected": want.tokens[step],
                     "got": out.tokens[step], "other_margin": round(want.margins[step], 6)}
            (ties if want.margins[step] < TIE_TOLERANCE[torch.float32] else findings).append(where)
    return with_ties(verdict("cross_engine", findings, f"{compared} golden request(s) agree with the other engine "
                     f"({len(ties)} ties)",
                     lambda f: f"{len(f)} request(s) differ from the other engine's golden; first: {f[0]['workload']} "
                               f"{f[0]['request']} step {f[0]['step']}: expected {f[0]['expected']}, got {f[0]['got']}",
                     views), ties)


ORACLE = Oracle("cross_engine", FAILS_WHEN, judge)
