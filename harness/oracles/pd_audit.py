"""pd_audit: PD's own bookkeeping, the ledger both sides keep of every handoff, adds up.

The records are facts each side wrote down: per transfer attempt (the reference engine's,
``reference_impl/pd/ledger.py``), or per pass, counted (``"kind": "counted"``: a real engine's metrics on each side,
with the decode side's KV layout). This compares them with each other, with the prompts, with the hits the cache
implies and with what the client saw, pass by pass (``PassView.got.pd``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from fixtures.workloads import CachedExpectation
from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict
from harness.sut.vllm_common.nixl import nixl_bytes


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "PD cells only: the ledger both sides keep of every handoff disagrees with the prompts or the client's view "
    "(checks: pages sent, abort left memory, staging regions, metadata slots, prefill verify scratch, "
    "cached_tokens; counted per pass: prefilled, decode split, connector hits, decode hit, bytes, transfers, "
    "failed transfers, expired leases (the prefill side freed a request's blocks unread after its lease, or heard of "
    "a read after that: vLLM's `kv_lease_duration`), prefill hit, emptied)"
)


def nixl_reads(lengths: Mapping[str, int], backoff: int, hits: Mapping[str, CachedExpectation]) -> tuple[int, int]:
    """How many of these requests (rid → prompt length) NIXL reads for, at least and at most, given the decode side's
    allowed hit of each (``hits``): vLLM's decode side asks the prefill side for the prompt but the ``backoff`` tokens,
    less its own hit, and for nothing when that is not positive (``NixlPullConnectorScheduler
    .get_num_new_matched_tokens``: ``_get_remote_prefill_token_count(len) - num_computed_tokens``); such a request
    only notifies the prefill side, with no transfer and no state moved (``NixlPullConnectorWorker._read_blocks``:
    "Full prefix cache hit"). A dense model's (no backoff) hit always leaves its last token: every request reads."""
    asked = {rid: n - backoff if backoff and n > backoff else n for rid, n in lengths.items()}
    least = sum(n > (hits[rid].hi if rid in hits else 0) for rid, n in asked.items())
    most = sum(n > (hits[rid].lo if rid in hits else 0) for rid, n in asked.items())
    return least, most


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pd_attempt_findings(view: PassView) -> list[dict]:
    """Per attempt: a landed one sent exactly the pages past the decode side's hit; a failed one left nothing."""
    findings, prompts, page_size = [], view.prompts, view.traits.cache.page_size
    for a in view.got.pd["attempts"]:
        at = {**view.where(), "request": a["rid"], "attempt": a["attempt"]}
        prompt = len(prompts.get(a["rid"], ())) or a["prompt_tokens"]
        if a["outcome"] == "success":
            want = _ceil_div(prompt, page_size) - a["decode_hit_pages"]
            if a["pages_sent"] != want:
                findings.append({**at, "check": "pages sent", "expected": want, "got": a["pages_sent"],
                                 "why": f"{prompt}-token prompt at page {page_size}, decode hit "
                                        f"{a['decode_hit_pages']} page(s)"})
        elif a["outcome"] == "failed":
            if a["decode_live_after"] or a["prefill_held_after"]:
                findings.append({**at, "check": "abort left memory", "expected": "nothing live or held",
                                 "got": {"decode pages still live": list(a["decode_live_after"]),
                                         "prefill still holds it": a["prefill_held_after"]}})
        else:
            findings.append({**at, "check": "attempt never ended", "expected": "success or failed", "got": a["outcome"]})
    return findings


def _pd_pass_findings(view: PassView) -> list[dict]:
    """Per pass: every staging region and metadata slot taken was given back; the prefill side has no verify scratch."""
    where = view.where()
    counts, findings = view.got.pd["decode"], []
    for what, taken, returned in (("staging regions", "staging_reserved", "staging_released"),
                                  ("metadata slots", "aux_taken", "aux_returned")):
        if counts[taken] != counts[returned]:
            findings.append({**where, "check": what, "expected": f"{counts[taken]} returned",
                             "got": f"{counts[returned]} of {counts[taken]} returned"})
    scratch = view.got.pd["verify_scratch_bytes"].get("prefill", 0)
    if scratch:
        findings.append({**where, "check": "prefill verify scratch", "expected": 0, "got": scratch,
                         "why": "a prefill server never verifies (SGLang #34191)"})
    return findings


def _pd_hit_findings(view: PassView) -> list[dict]:
    """Each client-visible cached-token split equals the hit the prefill side recorded when it admitted the request."""
    landed = {a["rid"]: a["prefill_hit"] for a in view.got.pd["attempts"] if a["outcome"] == "success"}
    findings = []
    for out in view.outputs:
        if out.finish_reason != "length" or out.rid not in landed:
            continue
        seen = [out.cached_tokens, out.cached_host, out.cached_storage]
        if landed[out.rid] is None or list(landed[out.rid]) != seen:
            findings.append({**view.where(), "request": out.rid, "check": "cached_tokens",
                             "expected": landed[out.rid], "got": seen, "why": "(total, host, storage): prefill side's "
                             "record at admission vs what the client saw"})
    missing = sorted({o.rid for o in view.outputs if o.finish_reason == "length"} - set(landed))
    if missing:
        findings.append({**view.where(), "request": missing[0], "check": "no landed attempt",
                         "expected": "a successful transfer", "got": f"{len(missing)} finished request(s) without one"})
    return findings


def _counted_findings(view: PassView, cold: PassView) -> list[dict]:
    """A pass's counted ledger: the prefill side computed every prompt but the decode side's backoff, the decode side
    read the rest past its own hit (within what the cache implies: a cold pass's where it was emptied before the
    pass, ``cold`` being the workload's cold pass) and computed the backoff, NIXL moved exactly those blocks (and
    the state of each request it read for: not of one whose decode-side hit leaves nothing to read, ``nixl_reads``)
    with no failure, and each client-visible hit is the prefill side's (its prefix cache's and its tier's)."""
    led, where = view.got.pd, view.where()
    prefill, decode, backoff, block = led["prefill"], led["decode"], led["backoff"], led["block_size"]
    lengths = [len(r.prompt) for r in view.requests]
    moved, hit = sum(n - backoff for n in lengths), decode["local_cache_hit"]
    expected = _decode_side(cold) if led.get("decode_cold") else _decode_side(view)
    bounds = [expected[r.rid] for r in view.requests if r.rid in expected]
    lo, hi = sum(e.lo for e in bounds), sum(e.hi for e in bounds)
    least, most = nixl_reads({r.rid: len(r.prompt) for r in view.requests}, backoff, expected)
    transfers = decode["nixl_transfers"]
    skipped = "" if most == len(lengths) else (f", but none for a request whose decode-side hit covers its prompt "
                                               f"less the last {backoff} token(s)")
    checks = [  # (check, expected, got, holds, why)
        ("prefilled", moved, prefill["prompt_tokens"], None, f"every prompt but the {backoff} token(s) the decode side "
         "computes"),
        ("decode split", {"computed": backoff * len(lengths), "read + hit": moved},
         {"computed": decode["local_compute"], "read + hit": decode["external_kv_transfer"] + hit}, None,
         "the decode side computes the backoff and reads or hits the rest"),
        ("connector hits", decode["external_kv_transfer"], decode["external_prefix_cache_hits"], None,
         "tokens the connector found = tokens read"),
        ("decode hit", lo if lo == hi else f"{lo}..{hi} (multiple of {block})", hit,
         lo <= hit <= hi and hit % block == 0, "the decode side's own prefix hit, summed: what the prompts imply"),
        ("transfers", least if least == most else f"{least}..{most}", transfers, least <= transfers <= most,
         f"one transfer per request{skipped}"),
        ("failed transfers", 0, decode["nixl_failed_transfers"] + prefill["nixl_failed_transfers"], None,
         "none may fail" + _logged(led.get("nixl_failures", {}))),
        ("expired leases", {"released unread": 0, "read after": 0},
         {"released unread": prefill["nixl_expired_leases"], "read after": prefill["nixl_reads_after_expiry"]}, None,
         "the prefill side keeps a request's blocks until the decode side has read them; past its lease "
         "(kv_lease_duration) it frees them, and a later read takes whatever they hold then"),
        ("prefill hit", sum(led["prefill_hits"].values()), prefill["local_cache_hit"] + prefill["external_kv_transfer"],
         None, "the prefill side's per-request hits add up to its counted hit (prefix cache and tier)"),
        ("emptied", "an empty prefix cache before the pass", "blocks still held" if not led["emptied"] else None,
         led["emptied"], "the prefill side frees what it leased once the decode side has read it"),
    ]
    if led["block_bytes"] is not None:
        want, why = nixl_bytes(lengths, backoff, hit, block, led["block_bytes"], led["state_bytes"],
                               states=min(max(transfers, least), most))
        checks.append(("bytes", want, decode["nixl_bytes"], None, why))
    findings = [{**where, "check": check, "expected": want, "got": got, "why": why}
                for check, want, got, holds, why in checks if not (want == got if holds is None else holds)]
    for out in view.outputs:
        if out.finish_reason == "length" and out.cached_tokens != led["prefill_hits"].get(out.rid):
            findings.append({**where, "request": out.rid, "check": "cached_tokens", "why": "the client's count is "
                             "the prefill side's hit", "expected": led["prefill_hits"].get(out.rid),
                             "got": out.cached_tokens})
    return findings


def _logged(failures: Mapping[str, Sequence[str]]) -> str:
    """What each side logged of its failed NIXL transfers (``failure_lines``), first line each, for a finding's why."""
    said = [f"{side} side logged {len(lines)}, first: {lines[0]}" for side, lines in failures.items() if lines]
    return "; " + "; ".join(said) if said else ""


def _decode_side(view: PassView) -> Mapping[str, CachedExpectation]:
    """rid → the decode side's own allowed prefix hit in ``view``'s pass: the client's, unless the rule names it."""
    return view.expected_cached if view.decode_cached is None else view.decode_cached


def judge(views: Sequence[PassView]) -> Verdict:
    """PD cells: each side's bookkeeping of the handoff adds up, against the prompts and the client's view.

    Per landed attempt, pages sent = the prompt's pages past the decode side's hit, exactly; per failed attempt,
    nothing it took is live on the decode side or held on the prefill side after the abort; per pass, every staging
    region and metadata slot comes back and the prefill side has no verify scratch; per request, cached_tokens
    (and its split) is what the prefill side recorded when it admitted the request.
    """
    armed = [v for v in views if v.got.pd is not None]
    if not armed:
        return Verdict("pd_audit", "skip", "no PD")
    findings, attempts = [], 0
    colds = {v.workload: v for v in armed if v.name == "cold"}
    for view in armed:
        if view.got.pd.get("kind") == "counted":
            attempts += view.got.pd["decode"]["nixl_transfers"]
            findings += _counted_findings(view, colds.get(view.workload, view))
            continue
        attempts += len(view.got.pd["attempts"])
        findings += _pd_attempt_findings(view) + _pd_pass_findings(view) + _pd_hit_findings(view)
    return verdict("pd_audit", findings, f"{attempts} transfer attempts account exactly",
                   lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} "
                             f"{f[0].get('request', '')} {f[0]['check']}: expected {f[0]['expected']}, got {f[0]['got']}",
                   views)


def script(views: Sequence[PassView], passes: Sequence[str]) -> dict:
    """A reproducer's check of the bytes NIXL moved: the prompt tokens the decode side computes itself (its backoff)."""
    return {"backoff": next(view.got.pd["backoff"] for view in views if view.got.pd is not None)}


#: a script judges the bytes a pass moved alone: the other checks read a ledger only the harness keeps.
ORACLE = Oracle("pd_audit", FAILS_WHEN, judge, script=script, script_checks=frozenset({"bytes"}))
