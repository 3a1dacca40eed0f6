"""pd_audit: PD's own bookkeeping, the ledger both sides keep of every handoff, adds up.

The records (``reference_impl/pd/ledger.py``) are facts each side wrote down; this compares them with each other,
with the prompts and with what the client saw, pass by pass (``PassView.got.pd``).
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import Oracle, PassView, verdict
from harness.results.rows import Verdict


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "PD cells only: the ledger both sides keep of every handoff disagrees with the prompts or the client's view "
    "(checks: pages sent, abort left memory, staging regions, metadata slots, prefill verify scratch, "
    "cached_tokens)"
)

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
    for view in armed:
        attempts += len(view.got.pd["attempts"])
        findings += _pd_attempt_findings(view) + _pd_pass_findings(view) + _pd_hit_findings(view)
    return verdict("pd_audit", findings, f"{attempts} transfer attempts account exactly",
                   lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} "
                             f"{f[0].get('request', '')} {f[0]['check']}: expected {f[0]['expected']}, got {f[0]['got']}",
                   views)


ORACLE = Oracle("pd_audit", FAILS_WHEN, judge)
