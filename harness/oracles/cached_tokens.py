"""cached_tokens: per request, the prompt tokens served from cache (and each tier's share) are what the engine's own
cache rule (``CacheTraits.rule``: its package's, citing its source) implies for the workload's prompts and rounds."""
from __future__ import annotations

from collections.abc import Sequence

from fixtures.workloads import CachedExpectation, tier_text
from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict
from reference_impl.request import TIERS, RequestOutput


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "a request's cached tokens, or one tier's share of them, differ from what the engine's own cache rule implies "
    "for the workload's shared prefixes, rounds, page size and capacity, exactly where the rule is exact, within its "
    "band where it is not (checks: exact, per tier, lower bound, upper bound, cache model, isolation, slot rule)"
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
    judged = exact = 0
    for view in views:
        for out in view.outputs:
            expect = view.expected_cached.get(out.rid)
            if expect is None or out.finish_reason != "length":
                continue
            split = out.cached_by_tier()
            judged, exact = judged + 1, exact + expect.exact
            if view.name == "warm":
                for tier, n in split.items():
                    warm[tier] += n
            ok = expect.admits(out.cached_tokens) and expect.admits_split(split["host"], split["storage"])
            if not ok or sum(split.values()) != out.cached_tokens:
                over = out.cached_tokens - expect.hi
                findings.append({**view.where(), "request": out.rid,
                                 "past_page": len(view.prompts[out.rid]) % expect.page_size,
                                 "pages_over": over / expect.page_size if over > 0 else 0,
                                 "expected": expect.describe(), "got": _by_tier(out), "rule": expect.basis,
                                 "expected_tiers": {"total": [expect.lo, expect.hi], "host": expect.host,
                                                    "storage": expect.storage},
                                 "got_tiers": {"total": out.cached_tokens, **split}})
    split = ", ".join(f"{tier} {n}" for tier, n in warm.items())
    return verdict("cached_tokens", findings,
                   f"as expected ({sum(warm.values())} warm cached tokens: {split}; {exact} of {judged} requests "
                   f"judged exactly)",
                   lambda f: f"{len(f)} request(s) off; first: {f[0]['workload']}/{f[0]['pass']} {f[0]['request']}: "
                             f"expected {f[0]['expected']}, got {f[0]['got']}" + _by_rule(f[0]['rule']), views)


def _by_rule(basis: str) -> str:
    return f" (by {basis})" if basis else ""


def script(views: Sequence[PassView], passes: Sequence[str]) -> dict:
    """A reproducer's check of cached tokens: what the engine's cache rule allows each request, in each pass judged."""
    allowed = {view.name: view.expected_cached for view in views}
    return {"cached": {name: {rid: _allowed(e) for rid, e in allowed[name].items()} for name in passes}}


def _allowed(expectation: CachedExpectation) -> dict:
    """A ``CachedExpectation`` as the script's check reads it: plain values."""
    allowed = {"values": list(expectation.values)} if expectation.values is not None else {
        "lo": expectation.lo, "hi": expectation.hi, "page": expectation.page_size}
    return {**allowed, "host": expectation.host, "storage": expectation.storage, "text": expectation.describe()}


#: shown as expected vs got per tier (device, host, storage, total).
ORACLE = Oracle("cached_tokens", FAILS_WHEN, judge, evidence="tiers", script=script)
