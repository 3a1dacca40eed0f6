"""Oracles: judge one cell's runs against the golden runs and the workload's expectations.

Each oracle looks at every workload and both passes (cold, warm) of a cell and returns one
Verdict whose detail names what a person needs to act: workload, pass, request, step,
expected, got. An oracle fails on silent damage only; an exception in the cell is an
``error`` status decided by the runner, not here.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fixtures.spec_expect import drafted_trace, ngram_trace
from fixtures.workloads import tier_text
from harness.results.rows import Verdict
from harness.run.pd_audit import pd_audit_oracle
from reference_impl.request import TIERS, RequestOutput
from reference_impl.spec.verify import outputs_accept_stats

PASSES = ("cold", "warm")

#: top-2 logit margin under which a greedy divergence is a tie, per dtype.
TIE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.125, torch.float16: 0.02}
#: largest per-token logprob difference accepted against the golden run, per dtype.
LOGPROB_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.02}
MAX_FINDINGS = 5
#: tokens kept around a divergence (before, from it on), golden and cell alike: enough to see both
#: sequences side by side, bounded so a 5,000-cell report stays small.
TOKEN_WINDOW = (16, 32)
#: relative drop of the mean accept length (vs the golden configuration with the same spec
#: algorithm, and warm vs cold) that fails a cell: greedy verification makes accept history a
#: function of the tokens, so only near-tie flips in non-deterministic mode may move it at all.
ACCEPT_TOLERANCE = 0.10


@dataclass(slots=True, kw_only=True)
class PassView:
    """What an oracle sees of one pass of one workload in the cell and in the golden run."""

    workload: str
    name: str  # "cold" or "warm"
    outputs: list[RequestOutput]
    golden: list[RequestOutput]
    requested: dict[str, int]               # rid -> max_new_tokens submitted
    expected_cached: dict[str, object]      # rid -> CachedExpectation
    nan_events: list
    audit: list[str]
    dtype: torch.dtype
    deterministic: bool = False
    hybrid: bool = False
    reference: list[RequestOutput] | None = None  # what this pass must equal bitwise (deterministic mode)
    reference_name: str = ""                      # "solo" (each request alone) or "cold"
    spec_reference: list[RequestOutput] | None = None  # golden levels with the cell's spec algorithm (spec cells)
    max_accept_length: int = 1                     # k + 1: the most a verify step can emit
    aborts_allowed: bool = False                   # PD with injected transport failures: "aborted" is a valid end
    spec: str = "none"                             # the cell's proposer level
    prompts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rid -> prompt submitted
    accept_band: tuple[float, float] | None = None  # the workload's measured mean accept length for this proposer
    counters: dict[str, int] | None = None         # the engine's own decode counters over this pass (EngineStats)
    logprob_tolerance: float | None = None         # declared for the cell's lossy levels ([[tolerances]])
    tie_tolerance: float | None = None
    audited: bool = True                           # the engine audits its idle pools (pool_audit)
    pass_counted: bool = False                     # counters hold the pass's drafts and accepted tokens only
    spec_reference_counters: dict[str, int] | None = None  # spec_reference's own counters (pass-counted engines)
    cross_reference: list[RequestOutput] | None = None     # another engine's golden on the same model (cold pass)

    def tie(self) -> float:
        """The top-2 margin under which a divergence is a tie: declared for the cell's levels, else the dtype's."""
        return self.tie_tolerance if self.tie_tolerance is not None else TIE_TOLERANCE[self.dtype]

    def logprob_tol(self) -> float:
        """The largest logprob difference accepted: declared for the cell's levels, else the dtype's."""
        return self.logprob_tolerance if self.logprob_tolerance is not None else LOGPROB_TOLERANCE[self.dtype]
    page_size: int = 1                             # tokens per KV page, as the engine applied it
    pd_ledger: dict | None = None                  # PD cells: what both sides recorded over the pass (pd_audit.py)

    def by_rid(self) -> dict[str, RequestOutput]:
        return {o.rid: o for o in self.outputs}

    def golden_by_rid(self) -> dict[str, RequestOutput]:
        return {o.rid: o for o in self.golden}


Oracle = Callable[[Sequence[PassView]], Verdict]


def _verdict(oracle: str, findings: list[dict], ok_message: str, fail_message: Callable[[list[dict]], str]) -> Verdict:
    if findings:
        return Verdict(oracle, "fail", fail_message(findings), findings[:MAX_FINDINGS])
    return Verdict(oracle, "pass", ok_message)


def _first_divergence(got: Sequence[int], want: Sequence[int]) -> int | None:
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return step
    return None


def tokens_oracle(views: Sequence[PassView]) -> Verdict:
    """Greedy tokens equal the golden run's, except at a near-tie of the golden top-2 logits."""
    findings, ties = [], []
    for view in views:
        golden = view.golden_by_rid()
        for out in view.outputs:
            want = golden.get(out.rid)
            if want is None or not out.tokens:
                continue
            step = _first_divergence(out.tokens, want.tokens)
            if step is None:
                continue
            start = max(0, step - TOKEN_WINDOW[0])
            where = {"workload": view.workload, "pass": view.name, "request": out.rid, "step": step,
                     "expected": want.tokens[step], "got": out.tokens[step], "golden_margin": round(want.margins[step], 6),
                     "window_start": start, "expected_tokens": want.tokens[start : step + TOKEN_WINDOW[1]],
                     "got_tokens": out.tokens[start : step + TOKEN_WINDOW[1]]}
            (ties if want.margins[step] < view.tie() else findings).append(where)
    verdict = _verdict(
        "tokens", findings, f"all tokens equal golden ({len(ties)} ties)",
        lambda f: f"{len(f)} request(s) diverge from golden; first: {f[0]['workload']}/{f[0]['pass']} "
                  f"{f[0]['request']} step {f[0]['step']}: expected {f[0]['expected']}, got {f[0]['got']}",
    )
    if ties and verdict.status == "pass":
        verdict.detail = [{"tie": True, **t} for t in ties[:MAX_FINDINGS]]
    return verdict


def _golden_token_logprob(out: RequestOutput, want: RequestOutput, step: int) -> float | None:
    """The cell's logprob of the golden token at ``step``, read from its top-k; None when not among them."""
    for token, logprob in zip(out.top_ids[step], out.top_logprobs[step]):
        if token == want.tokens[step]:
            return logprob
    return None


def logprobs_oracle(views: Sequence[PassView]) -> Verdict:
    """Logprobs of the golden tokens match golden within the dtype's tolerance, up to the first divergence.

    At a divergence that is not a tie, the cell's logprob of the token golden chose (from its top-k)
    is compared too: damage that flips the very first decoded token shows here, not only in ``tokens``.
    """
    findings = []
    worst = 0.0
    for view in views:
        golden = view.golden_by_rid()
        tol = view.logprob_tol()
        for out in view.outputs:
            want = golden.get(out.rid)
            if want is None:
                continue
            stop = _first_divergence(out.tokens, want.tokens)
            steps = [(s, out.logprobs[s]) for s in range(min(len(out.logprobs), len(want.logprobs)) if stop is None else stop)]
            if stop is not None and want.margins[stop] >= view.tie():
                steps.append((stop, _golden_token_logprob(out, want, stop)))
            for step, got in steps:
                delta = float("inf") if got is None else abs(got - want.logprobs[step])
                worst = max(worst, delta if delta == delta else float("inf"))
                if not delta <= tol:
                    findings.append({"workload": view.workload, "pass": view.name, "request": out.rid, "step": step,
                                     "expected": want.logprobs[step], "got": got, "delta": delta, "tolerance": tol})
                    break
    return _verdict("logprobs", findings, f"max |Δ logprob| {worst:.2e}",
                    lambda f: f"{len(f)} request(s) off by more than {f[0]['tolerance']}; first: {f[0]['request']} "
                              f"step {f[0]['step']}: Δ {f[0]['delta']:.3g}")


def nan_oracle(views: Sequence[PassView]) -> Verdict:
    """No NaN/Inf in logits, attention outputs or Mamba states, and every returned logprob finite."""
    findings = []
    for view in views:
        for event in view.nan_events:
            findings.append({"workload": view.workload, "pass": view.name, "where": event.where, "step": event.step, "requests": event.rids})
        for out in view.outputs:
            bad = [i for i, lp in enumerate(out.logprobs) if not -float("inf") < lp < float("inf")]
            if bad:
                findings.append({"workload": view.workload, "pass": view.name, "where": "logprobs", "request": out.rid, "step": bad[0]})
    return _verdict("nan", findings, "no NaN/Inf seen",
                    lambda f: f"non-finite values: first in {f[0]['where']} ({f[0]['workload']}/{f[0]['pass']})")


def _by_tier(out: RequestOutput) -> str:
    """cached_tokens as the request reported it, with the tiers below L1 that supplied part of it."""
    split = out.cached_by_tier()
    parts = sum(split.values())
    terms = " + ".join(f"{tier} {n}" for tier, n in split.items())
    notes = () if parts == out.cached_tokens else (f"but {terms} = {parts}",)
    return tier_text(str(out.cached_tokens), split["host"], split["storage"], *notes)


def cached_tokens_oracle(views: Sequence[PassView]) -> Verdict:
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
                findings.append({"workload": view.workload, "pass": view.name, "request": out.rid,
                                 "expected": expect.describe(), "got": _by_tier(out),
                                 "expected_tiers": {"total": [expect.lo, expect.hi], "host": expect.host,
                                                    "storage": expect.storage},
                                 "got_tiers": {"total": out.cached_tokens, **split}})
    split = ", ".join(f"{tier} {n}" for tier, n in warm.items())
    return _verdict("cached_tokens", findings, f"as expected ({sum(warm.values())} warm cached tokens: {split})",
                    lambda f: f"{len(f)} request(s) off; first: {f[0]['workload']}/{f[0]['pass']} {f[0]['request']}: "
                              f"expected {f[0]['expected']}, got {f[0]['got']}")


def completeness_oracle(views: Sequence[PassView]) -> Verdict:
    """Every submitted request finishes exactly once, with exactly the tokens it asked for.

    Where the cell injects transport failures (PD), a request may instead end ``aborted`` with
    no token: it was retried once and failed again, and the engine said so.
    """
    findings, aborted = [], 0
    for view in views:
        seen: dict[str, int] = {}
        for out in view.outputs:
            seen[out.rid] = seen.get(out.rid, 0) + 1
            want = view.requested.get(out.rid)
            if want is None:
                findings.append({"workload": view.workload, "pass": view.name, "request": out.rid, "problem": "never submitted"})
            elif view.aborts_allowed and out.finish_reason == "aborted" and not out.tokens and out.error:
                aborted += 1
            elif out.finish_reason != "length" or len(out.tokens) != want:
                findings.append({"workload": view.workload, "pass": view.name, "request": out.rid,
                                 "problem": f"finished '{out.finish_reason}' with {len(out.tokens)} of {want} tokens {out.error}".strip()})
        for rid in view.requested:
            count = seen.get(rid, 0)
            if count != 1:
                problem = "never finished (lost)" if count == 0 else f"finished {count} times"
                findings.append({"workload": view.workload, "pass": view.name, "request": rid, "problem": problem})
    ok = (f"every request ended once: {aborted} aborted after a failed transfer and a failed retry, "
          "the rest with their length") if aborted else "every request finished once with its length"
    return _verdict("completeness", findings, ok,
                    lambda f: f"{len(f)} problem(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['request']} {f[0]['problem']}")


def pool_audit_oracle(views: Sequence[PassView]) -> Verdict:
    """No page or state slot leaked or doubly owned when idle, and no freed page read."""
    if not any(v.audited for v in views):
        return Verdict("pool_audit", "skip", "the engine under test reports no pool audit")
    findings = [{"workload": v.workload, "pass": v.name, "problem": p} for v in views for p in v.audit]
    return _verdict("pool_audit", findings, "pools and cache consistent when idle",
                    lambda f: f"{len(f)} problem(s); first: {f[0]['workload']}/{f[0]['pass']}: {f[0]['problem']}")


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


def batch_invariance_oracle(views: Sequence[PassView]) -> Verdict:
    """Deterministic mode: a request's logits are bitwise equal alone vs in the batch, and cold vs warm.

    A hybrid request that was preempted is exempt: its recompute replays decoded tokens
    through the chunked SSD scan instead of the recurrent step, which no engine makes bitwise.
    """
    findings, checked, exempt = [], 0, 0
    armed = [v for v in views if v.deterministic and v.reference is not None]
    for view in armed:
        reference = {o.rid: o for o in view.reference}
        for out in view.outputs:
            want = reference.get(out.rid)
            if want is None or out.finish_reason != "length":
                continue
            if view.hybrid and (out.preemptions or want.preemptions):
                exempt += 1
                continue
            checked += 1
            diff = _bitwise_difference(out, want)
            if diff:
                findings.append({"workload": view.workload, "pass": view.name, "against": view.reference_name,
                                 "request": out.rid, **diff})
    if not armed:
        return Verdict("batch_invariance", "skip", "deterministic mode is off")
    return _verdict("batch_invariance", findings, f"{checked} requests bitwise invariant ({exempt} preempted, exempt)",
                    lambda f: f"{len(f)} request(s) not bitwise invariant; first: {f[0]['workload']}/{f[0]['pass']} "
                              f"vs {f[0]['against']} {f[0]['request']} step {f[0]['step']} ({f[0]['what']})")


def _mean_or_one(outputs: Sequence[RequestOutput]) -> float:
    """Mean accept length, 1.0 (one token per step, as plain decoding) when nothing was verified."""
    mean = outputs_accept_stats(outputs).mean_accept_length
    return 1.0 if mean is None else mean


def _movers(got: Sequence[RequestOutput], want: Sequence[RequestOutput]) -> list[dict]:
    """The requests whose accept length dropped most against the reference, largest drop first."""
    reference = {o.rid: o for o in want}
    moved = [(_mean_or_one([reference[o.rid]]) - _mean_or_one([o]), o.rid) for o in got if o.rid in reference]
    return [{"request": rid, "drop": round(drop, 4)} for drop, rid in sorted(moved, reverse=True)[:3] if drop > 0]


def _relative_findings(view: PassView, cold: dict[str, list[RequestOutput]]) -> list[dict]:
    """Against golden-with-this-proposer and warm against cold: no drop beyond tolerance, never above k + 1."""
    findings = []
    references = [("golden", view.spec_reference)]
    if view.name == "warm" and view.workload in cold:
        references.append(("cold", cold[view.workload]))
    for against, reference in references:
        # only requests present on both sides: a lost request is completeness's finding, not this one's, and one
        # aborted after failed transfers (PD with pd_fail_rate) decoded nothing to compare
        present = ({o.rid for o in view.outputs if o.finish_reason != "aborted"}
                   & {o.rid for o in reference if o.finish_reason != "aborted"})
        outputs = [o for o in reference if o.rid in present]
        got = _mean_or_one([o for o in view.outputs if o.rid in present])
        want = _mean_or_one(outputs)
        if got < want * (1 - ACCEPT_TOLERANCE) or got > view.max_accept_length:
            findings.append({
                "workload": view.workload, "pass": view.name, "check": "relative", "against": against,
                "expected": round(want, 4), "got": round(got, 4), "max": view.max_accept_length,
                "histogram": outputs_accept_stats(view.outputs).to_json()["histogram"],
                "expected_histogram": outputs_accept_stats(outputs).to_json()["histogram"],
                "movers": _movers(view.outputs, outputs),
            })
    return findings


def _band_findings(view: PassView) -> list[dict]:
    """The pass's mean accept length (requests never preempted) inside the band measured for this workload and
    proposer, not taken from golden."""
    if view.accept_band is None or any(o.finish_reason == "aborted" for o in view.outputs):
        return []  # a pass that lost requests to failed transfers does not average over the workload's requests
    lo, hi = view.accept_band
    # a preempted request restarts its step grid with a token from prefill: its steps are not the workload's
    got = _mean_or_one([o for o in view.outputs if o.finish_reason == "length" and not o.preemptions])
    if lo <= got <= hi:
        return []
    return [{"workload": view.workload, "pass": view.name, "check": "band", "against": "measured band",
             "expected": f"{lo}..{hi}", "got": round(got, 4), "max": view.max_accept_length,
             "histogram": outputs_accept_stats(view.outputs).to_json()["histogram"]}]


def _recount_findings(view: PassView) -> list[dict]:
    """The accept accounting agrees with the engine's own counters of decode forwards and emitted tokens."""
    if view.counters is None:
        return []
    finished = [o for o in view.outputs if o.finish_reason == "length"]
    stats = outputs_accept_stats(finished)
    books = {
        "verify steps": (stats.steps, view.counters["verify_steps"]),
        "tokens emitted by verify steps": (stats.emitted, view.counters["verify_emitted"]),
        "decode forwards": (sum(len(o.accepted) for o in finished), view.counters["decode_forwards"]),
        "tokens emitted by decode": (sum(a + 1 for o in finished for a in o.accepted), view.counters["emitted_tokens"]),
    }
    return [{"workload": view.workload, "pass": view.name, "check": "recount", "against": "engine counters",
             "what": what, "expected": counted, "got": reported}
            for what, (reported, counted) in books.items() if reported != counted]


def _trace_findings(view: PassView, k: int) -> list[dict]:
    """Per request, each step drafted what the proposer must (ngram: and accepted what prompt lookup implies)."""
    findings = []
    for out in view.outputs:
        want = view.requested.get(out.rid)
        if want is None or out.finish_reason != "length" or out.preemptions or out.rid not in view.prompts:
            continue  # a preempted request's recompute emits a token from prefill: the step grid restarts
        if view.spec == "ngram":
            accepted, drafted = ngram_trace(view.prompts[out.rid], out.tokens, k, want)
        else:
            accepted, drafted = list(out.accepted), drafted_trace(out.accepted, k, want)
        if (list(out.accepted), list(out.drafted)) != (accepted, drafted):
            step = _first_divergence([*zip(out.accepted, out.drafted), None], [*zip(accepted, drafted), None])
            findings.append({"workload": view.workload, "pass": view.name, "check": "trace", "request": out.rid,
                             "against": "prompt lookup replay" if view.spec == "ngram" else "draft room", "step": step,
                             "expected": {"accepted": accepted[step:step + 4], "drafted": drafted[step:step + 4]},
                             "got": {"accepted": out.accepted[step:step + 4], "drafted": out.drafted[step:step + 4]}})
    return findings


def pass_accept_length(counters: dict[str, int] | None) -> float:
    """Mean accept length of a pass from its counters (vLLM's 1 + accepted / drafts), 1.0 without a draft."""
    drafts = (counters or {}).get("drafts", 0)
    return 1.0 + counters["accepted_tokens"] / drafts if drafts else 1.0


def _counted_findings(view: PassView, cold: dict[str, dict[str, int] | None]) -> list[dict]:
    """A pass-counted engine: the pass's mean accept length against golden-with-this-spec and warm against cold
    (no drop past the tolerance, never above k + 1); the self-draft level exactly k + 1; the measured band."""
    got = pass_accept_length(view.counters)
    references = [("golden", pass_accept_length(view.spec_reference_counters))]
    if view.name == "warm" and cold.get(view.workload) is not None:
        references.append(("cold", pass_accept_length(cold[view.workload])))
    found = [{"workload": view.workload, "pass": view.name, "check": "relative", "against": against,
              "expected": round(want, 4), "got": round(got, 4), "max": view.max_accept_length}
             for against, want in references if got < want * (1 - ACCEPT_TOLERANCE) or got > view.max_accept_length]
    exact = view.max_accept_length if view.spec == "self" else None  # the target drafting for itself: all accepted
    band = (exact, exact) if exact is not None else view.accept_band
    if band is not None and not band[0] <= got <= band[1]:
        found.append({"workload": view.workload, "pass": view.name, "check": "band",
                      "against": "k + 1 (self-draft)" if exact is not None else "measured band",
                      "expected": f"{band[0]}..{band[1]}", "got": round(got, 4), "max": view.max_accept_length,
                      "counters": dict(view.counters or {})})
    return found


def accept_length_oracle(views: Sequence[PassView]) -> Verdict:
    """Spec cells: accept length holds against golden-with-this-spec, warm against cold, the workload's measured
    band and the engine's own counters; each request drafted (and, for ngram, accepted) what it must.

    An engine that counts per pass only (vLLM's spec_decode counters) is judged on each pass's mean."""
    armed = [v for v in views if v.spec_reference is not None]
    if not armed:
        return Verdict("accept_length", "skip", "no speculative decoding")
    if all(v.pass_counted for v in armed):
        cold_counters = {v.workload: v.counters for v in armed if v.name == "cold"}
        findings = [f for view in armed for f in _counted_findings(view, cold_counters)]
        if not any((v.counters or {}).get("drafts", 0) for v in armed):  # the proposer was never exercised
            findings.append({"workload": "every workload", "pass": "every pass", "check": "drafted",
                             "against": f"spec = {armed[0].spec}", "expected": "> 0 drafts", "got": 0})
        means = [pass_accept_length(v.counters) for v in armed]
        return _verdict("accept_length", findings, f"mean accept length {min(means):.3f}..{max(means):.3f} as expected",
                        lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['check']} vs "
                                  f"{f[0]['against']}: {f[0]['got']} (expected {f[0]['expected']})")
    cold = {v.workload: v.outputs for v in armed if v.name == "cold"}
    findings, means = [], []
    for view in armed:
        means.append(_mean_or_one(view.outputs))
        findings += _relative_findings(view, cold) + _band_findings(view) + _recount_findings(view)
        findings += _trace_findings(view, view.max_accept_length - 1)
    return _verdict("accept_length", findings, f"mean accept length {min(means):.3f}..{max(means):.3f} as expected",
                    lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['check']} vs {f[0]['against']}: "
                              f"{f[0].get('what') or f[0].get('request') or 'mean accept length'} {f[0]['got']} "
                              f"(expected {f[0]['expected']})")


def cross_engine_oracle(views: Sequence[PassView]) -> Verdict:
    """The cell's golden run agrees token for token with another engine's golden on the same weights (the
    reference engine serving the exported checkpoint), except where the other engine's top-2 margin is a tie."""
    armed = [v for v in views if v.cross_reference is not None and v.name == "cold"]
    if not armed:
        return Verdict("cross_engine", "skip", "no second engine serves this model")
    findings, ties, compared = [], [], 0
    for view in armed:
        other = {o.rid: o for o in view.cross_reference}
        for out in view.golden:
            want = other.get(out.rid)
            if want is None or not out.tokens:
                continue
            compared += 1
            step = _first_divergence(out.tokens, want.tokens)
            if step is None:
                continue
            where = {"workload": view.workload, "request": out.rid, "step": step, "expected": want.tokens[step],
                     "got": out.tokens[step], "other_margin": round(want.margins[step], 6)}
            (ties if want.margins[step] < TIE_TOLERANCE[torch.float32] else findings).append(where)
    verdict = _verdict("cross_engine", findings, f"{compared} golden request(s) agree with the other engine "
                       f"({len(ties)} ties)",
                       lambda f: f"{len(f)} request(s) differ from the other engine's golden; first: {f[0]['workload']} "
                                 f"{f[0]['request']} step {f[0]['step']}: expected {f[0]['expected']}, got {f[0]['got']}")
    if ties and verdict.status == "pass":
        verdict.detail = [{"tie": True, **t} for t in ties[:MAX_FINDINGS]]
    return verdict


ORACLES: dict[str, Oracle] = {
    "tokens": tokens_oracle,
    "logprobs": logprobs_oracle,
    "nan": nan_oracle,
    "cached_tokens": cached_tokens_oracle,
    "batch_invariance": batch_invariance_oracle,
    "completeness": completeness_oracle,
    "pool_audit": pool_audit_oracle,
    "accept_length": accept_length_oracle,
    "cross_engine": cross_engine_oracle,
    "pd_audit": pd_audit_oracle,
}


def judge(views: Sequence[PassView]) -> dict[str, Verdict]:
    """Every oracle's verdict on one cell, in a stable order."""
    return {name: oracle(views) for name, oracle in ORACLES.items()}
