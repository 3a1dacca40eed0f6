"""cached_tokens: per request, the prompt tokens served from cache (and each tier's share) are what the workload's
shared prefixes, the page size and the engine's cache rule imply."""
from __future__ import annotations

from collections.abc import Sequence

from fixtures.workloads import tier_text
from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict
from reference_impl.request import TIERS, RequestOutput


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a request's cached tokens, or one tier's share of them, differ from what the workload's shared prefixes, page "
    "size, capacity and the engine's cache rule imply (checks: exact, per tier, lower bound, upper bound, cache "
    "model, isolation)"
)

def _by_tier(out: RequestOutput) -> str:
    """cached_tokens as the request reported it, with the tiers below L1 that supplied part of it."""
    split = out.cached_by_tier()
    parts = sum(split.values())
    terms = " + ".join(f"{tier} {n}" for tier, n in split.items())
    notes = () if parts == out.cached_tokens else (f"but {terms} = {parts}",)
    return tier_text(str(out.cached_tokens), split["host"], split["storage"], *notes)


def judge(views: Sequence[PassView]) -> Verdict:
    """Per-request cached_tokens, and the share each tier below L1 supplied, equal what the workload implies."""
    findings, warm = [], dict.fromkeys(TIERS, 0)
    for view in views:
        for out in view.outputs:
            expect = view.expected_cached.get(out.rid)
            if expect is None or out.finish_reason != "length":
                continue
            split = out.cached_by_tier()
            if view.name == "warm":
                for tier, n in split.items():
                    warm[tier] += n
            ok = expect.admits(out.cached_tokens) and expect.admits_split(split["host"], split["storage"])
            if not ok or sum(split.values()) != out.cached_tokens:
                findings.append({**view.where(), "request": out.rid,
                                 "expected": expect.describe(), "got": _by_tier(out),
                                 "expected_tiers": {"total": [expect.lo, expect.hi], "host": expect.host,
                                                    "storage": expect.storage},
                                 "got_tiers": {"total": out.cached_tokens, **split}})
    split = ", ".join(f"{tier} {n}" for tier, n in warm.items())
    return verdict("cached_tokens", findings, f"as expected ({sum(warm.values())} warm cached tokens: {split})",
                   lambda f: f"{len(f)} request(s) off; first: {f[0]['workload']}/{f[0]['pass']} {f[0]['request']}: "
                             f"expected {f[0]['expected']}, got {f[0]['got']}", views)


ORACLE = Oracle("cached_tokens", FAILS_WHEN, judge)
