"""completeness: every submitted request finishes exactly once with the tokens it asked for."""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a request is lost, finishes twice, or with a length other than requested (a PD cell with `pd_fail_rate` > 0 "
    "may report a request `aborted`, with its reason, after a failed retry)"
)

def judge(views: Sequence[PassView]) -> Verdict:
    """Every submitted request finishes exactly once, with exactly the tokens it asked for.

    Where the cell injects transport failures (PD), a request may instead end ``aborted`` with
    no token: it was retried once and failed again, and the engine said so.
    """
    findings, aborted = [], 0
    for view in views:
        seen: dict[str, int] = {}
        requested = view.requested
        for out in view.outputs:
            seen[out.rid] = seen.get(out.rid, 0) + 1
            want = requested.get(out.rid)
            if want is None:
                findings.append({**view.where(), "request": out.rid, "problem": "never submitted"})
            elif view.traits.aborts_allowed and out.finish_reason == "aborted" and not out.tokens and out.error:
                aborted += 1
            elif out.finish_reason != "length" or len(out.tokens) != want:
                findings.append({**view.where(), "request": out.rid,
                                 "problem": f"finished '{out.finish_reason}' with {len(out.tokens)} of {want} tokens "
                                            f"{out.error}".strip()})
        for rid in requested:
            count = seen.get(rid, 0)
            if count != 1:
                problem = "never finished (lost)" if count == 0 else f"finished {count} times"
                findings.append({**view.where(), "request": rid, "problem": problem})
    ok = (f"every request ended once: {aborted} aborted after a failed transfer and a failed retry, "
          "the rest with their length") if aborted else "every request finished once with its length"
    return verdict("completeness", findings, ok,
                   lambda f: f"{len(f)} problem(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['request']} "
                             f"{f[0]['problem']}", views)


ORACLE = Oracle("completeness", FAILS_WHEN, judge)
