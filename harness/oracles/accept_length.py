"""accept_length: a speculative cell's accept length holds against golden-with-this-proposer, warm against cold,
the workload's measured band and the engine's own counters; each request drafted what its proposer must.

Accept length is "tokens emitted per verification step, bonus token included"
(``reference_impl.spec.verify.outputs_accept_stats``). An engine that counts per pass only (vLLM's spec_decode
counters, a server's) is judged on each pass's mean, 1 + accepted / drafts, and, where its proposer's rule is known
(n-gram lookup, a draft model the reference runs), on its counters against that rule replayed over the pass's own
tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

from fixtures.spec_expect import drafted_trace, replay_trace
from harness.oracles.view import Oracle, PassView, first_divergence, verdict
from harness.results.rows import Verdict
from reference_impl.request import RequestOutput
from reference_impl.spec.verify import outputs_accept_stats

#: relative drop of the mean accept length (vs the golden configuration with the same spec
#: algorithm, and warm vs cold) that fails a cell: greedy verification makes accept history a
#: function of the tokens, so only near-tie flips in non-deterministic mode may move it at all.
ACCEPT_TOLERANCE = 0.10


#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "spec cells only: a pass's mean accept length drops against the golden levels with the same proposer or from "
    "cold to warm, leaves the band measured for its workload, exceeds k + 1, disagrees with the engine's own "
    "counters, a request drafted other than its proposer must, a pass's counters differ from the engine's "
    "proposer (n-gram lookup, a draft model the reference runs) replayed over its tokens, or the engine counts as "
    "drafts placeholders its scheduler made (checks: relative, band, trace, recount, drafted, replay, placeholders)"
)
#: a pass's counters that an engine's scheduler adds to its drafts, which no proposer made (vLLM's padding of a request
#: with one token left, ``harness/sut/vllm/counts.py``), by the counter they are counted in
PLACEHOLDERS = {"drafts": "placeholder_drafts", "draft_tokens": "placeholder_tokens"}


def _mean_or_one(outputs: Sequence[RequestOutput]) -> float:
    """Mean accept length, 1.0 (one token per step, as plain decoding) when nothing was verified."""
    mean = outputs_accept_stats(outputs).mean_accept_length
    return 1.0 if mean is None else mean


def missed_bound(got: float, want: float, most: int) -> str | None:
    """The bound a mean accept length ``got`` broke, as the finding prints it (None: it holds): never above ``most``
    (k + 1), never below the reference's ``want`` less ``ACCEPT_TOLERANCE``."""
    if got > most:
        return f"at most {most} (k + 1)"
    if got < (floor := want * (1 - ACCEPT_TOLERANCE)):
        return f"at least {floor:.4g} ({want:.4g} less {ACCEPT_TOLERANCE:.0%})"
    return None


def _movers(got: Sequence[RequestOutput], want: Sequence[RequestOutput]) -> list[dict]:
    """The requests whose accept length dropped most against the reference, largest drop first."""
    reference = {o.rid: o for o in want}
    moved = [(_mean_or_one([reference[o.rid]]) - _mean_or_one([o]), o.rid) for o in got if o.rid in reference]
    return [{"request": rid, "drop": round(drop, 4)} for drop, rid in sorted(moved, reverse=True)[:3] if drop > 0]


def _relative_findings(view: PassView, cold: dict[str, list[RequestOutput]]) -> list[dict]:
    """Against golden-with-this-proposer and warm against cold: no drop beyond tolerance, never above k + 1."""
    findings, most = [], view.traits.spec.max_accept_length
    references = [("golden", view.reference("spec_golden"))]
    if view.name == "warm" and view.workload in cold:
        references.append(("cold", cold[view.workload]))
    for against, reference in references:
        # only requests present on both sides: a lost request is completeness's finding, not this one's, and one
        # aborted after failed transfers (PD with pd_fail_rate) decoded nothing to compare
        present = ({o.rid for o in view.outputs if o.finish_reason != "aborted"}
                   & {o.rid for o in reference if o.finish_reason != "aborted"})
        outputs = [o for o in reference if o.rid in present]
        got = _mean_or_one([o for o in view.outputs if o.rid in present])
        if (expected := missed_bound(got, _mean_or_one(outputs), most)) is None:
            continue
        findings.append({
            **view.where(), "check": "relative", "against": against, "expected": expected, "got": round(got, 4),
            "max": most, "histogram": outputs_accept_stats(view.outputs).to_json()["histogram"],
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
    return [{**view.where(), "check": "band", "against": "measured band", "expected": f"{lo}..{hi}",
             "got": round(got, 4), "max": view.traits.spec.max_accept_length,
             "histogram": outputs_accept_stats(view.outputs).to_json()["histogram"]}]


def _recount_findings(view: PassView) -> list[dict]:
    """The accept accounting agrees with the engine's own counters of decode forwards and emitted tokens."""
    counters = view.got.counters
    if "verify_steps" not in counters:  # an engine that counts no verify steps (only preemptions, say)
        return []
    finished = [o for o in view.outputs if o.finish_reason == "length"]
    stats = outputs_accept_stats(finished)
    books = {
        "verify steps": (stats.steps, counters["verify_steps"]),
        "tokens emitted by verify steps": (stats.emitted, counters["verify_emitted"]),
        "decode forwards": (sum(len(o.accepted) for o in finished), counters["decode_forwards"]),
        "tokens emitted by decode": (sum(a + 1 for o in finished for a in o.accepted), counters["emitted_tokens"]),
    }
    return [{**view.where(), "check": "recount", "against": "engine counters", "what": what, "expected": counted,
             "got": reported}
            for what, (reported, counted) in books.items() if reported != counted]


def _trace_findings(view: PassView) -> list[dict]:
    """Per request, each step drafted what the proposer must (ngram: and accepted what prompt lookup implies)."""
    findings, spec = [], view.traits.spec
    requested, prompts = view.requested, view.prompts
    for out in view.outputs:
        want = requested.get(out.rid)
        if want is None or out.finish_reason != "length" or out.preemptions or not prompts.get(out.rid):
            continue  # a preempted request's recompute emits a token from prefill: the step grid restarts
        if spec.method == "ngram":
            trace = replay_trace(prompts[out.rid], out.tokens, spec.k, want)
            accepted, drafted = trace.accepted, trace.drafted
        else:
            accepted, drafted = list(out.accepted), drafted_trace(out.accepted, spec.k, want)
        if (list(out.accepted), list(out.drafted)) != (accepted, drafted):
            step = first_divergence([*zip(out.accepted, out.drafted), None], [*zip(accepted, drafted), None])
            findings.append({**view.where(), "check": "trace", "request": out.rid,
                             "against": "prompt lookup replay" if spec.method == "ngram" else "draft room", "step": step,
                             "expected": {"accepted": accepted[step:step + 4], "drafted": drafted[step:step + 4]},
                             "got": {"accepted": out.accepted[step:step + 4], "drafted": out.drafted[step:step + 4]}})
    return findings


def proposed(counters: dict[str, int] | None) -> dict[str, int] | None:
    """A pass's counters less the placeholder drafts the engine counted in them (``PLACEHOLDERS``): the proposer's
    own drafts, which its rule, golden and cold are held to; the placeholders are a finding of their own."""
    if counters is None:
        return None
    return {**counters, **{key: counters.get(key, 0) - counters[extra] for key, extra in PLACEHOLDERS.items()
                           if extra in counters}}


def _placeholder_findings(view: PassView) -> list[dict]:
    """The engine's counters count as drafts the verify steps its scheduler padded with placeholders no proposer made
    (vLLM: vllm-project/vllm#45237's padding counted, #50518 open)."""
    padded = view.got.counters.get("placeholder_drafts", 0)
    if not padded:
        return []
    return [{**view.where(), "check": "placeholders", "against": "the proposer's own drafts", "what": "drafts",
             "expected": 0, "got": padded, "tokens": view.got.counters.get("placeholder_tokens", 0)}]


def pass_accept_length(counters: dict[str, int] | None) -> float:
    """Mean accept length of a pass from its counters (vLLM's 1 + accepted / drafts), 1.0 without a draft."""
    drafts = (counters or {}).get("drafts", 0)
    return 1.0 + counters["accepted_tokens"] / drafts if drafts else 1.0


def _replay_findings(view: PassView) -> list[dict] | None:
    """A pass-counted proposer whose rule is known (``SpecTraits.replay``: prompt lookup, or a draft model the
    reference runs): the pass's counters against that rule replayed over each request's prompt and tokens
    (``fixtures.spec_expect.replay_trace``), summed over the pass.

    Drafts (verify steps with a draft) and draft tokens are exact: each step's draft is a function of the tokens
    before it. Accepted tokens are exact but for a request whose last step's draft matched every token left in its
    output: a rule not ``within_request`` (vLLM's) verified the rest of that draft against tokens past the output's
    end, which the output does not show, so the count may exceed the replay by up to those draft tokens. A pass with
    a request whose replay rests on a model's draft token chosen at a near-tie (the cell's tie tolerance) is not
    judged: which of the two the engine drafted is not known. None: the pass was not replayed.
    """
    rule, counters = view.traits.spec.replay, proposed(view.got.counters)
    requested, prompts = view.requested, view.prompts
    if counters.get("preemptions", 0):
        return None  # a preempted request is recomputed and drafts anew from there: its steps are not the replay's
    if not view.traits.spec.replay_hits and any(o.cached_tokens for o in view.outputs):
        return None  # the proposer drafts over matched blocks from a state the engine documents as not the request's
    if rule is None or any(
            o.finish_reason != "length" or not prompts.get(o.rid) or o.rid not in requested for o in view.outputs):
        return None  # the counters are the pass's: one request the replay cannot follow leaves none to compare
    traces = [replay_trace(prompts[o.rid], o.tokens, view.traits.spec.k, requested[o.rid], rule, view.tie())
              for o in view.outputs]
    if any(t.unsure is not None for t in traces):
        return None
    accepted = sum(sum(t.accepted) for t in traces)
    books = {
        "drafts": (sum(d > 0 for t in traces for d in t.drafted),) * 2,
        "draft_tokens": (sum(sum(t.drafted) for t in traces),) * 2,
        "accepted_tokens": (accepted, accepted + sum(t.unseen for t in traces)),
    }
    return [{**view.where(), "check": "replay", "against": f"replay of {rule.name}", "what": what,
             "expected": lo if lo == hi else f"{lo}..{hi}", "got": counters.get(what, 0)}
            for what, (lo, hi) in books.items() if not lo <= counters.get(what, 0) <= hi]


def _counted_findings(view: PassView, cold: dict[str, dict[str, int] | None]) -> tuple[list[dict], bool]:
    """A pass-counted engine: the pass's mean accept length against golden-with-this-spec and warm against cold
    (no drop past the tolerance, never above k + 1); the self-draft level exactly k + 1; the measured band; a
    proposer's counters against the replay of its rule, placeholders not counted as its drafts but found apart.
    Also whether the pass was replayed."""
    got, most = pass_accept_length(proposed(view.got.counters)), view.traits.spec.max_accept_length
    whole = view.traits.spec.whole_drafts
    references = [("golden", pass_accept_length(proposed(view.references["spec_golden"].counters)))]
    if view.name == "warm" and cold.get(view.workload) is not None:
        references.append(("cold", pass_accept_length(proposed(cold[view.workload]))))
    if not whole:  # the step budget may cut drafts, by the engine's design: the length is the scheduler's too
        references = [("k + 1", 0.0)]
    found = _placeholder_findings(view)
    for against, want in references:
        if (expected := missed_bound(got, want, most)) is not None:
            found.append({**view.where(), "check": "relative", "against": against, "expected": expected,
                          "got": round(got, 4), "max": most})
    # the target drafting for itself accepts every draft token: k + 1 where the drafts are whole; a pass whose requests
    # each decoded one token at most (a prefill-only draw of the boundary family) had no step to draft in
    exact = most if view.traits.spec.method == "self" and whole else None
    band = (exact, exact) if exact is not None else view.accept_band if whole else None
    if not could_draft(view):
        band = None
    if band is not None and not band[0] <= got <= band[1]:
        found.append({**view.where(), "check": "band",
                      "against": "k + 1 (self-draft)" if exact is not None else "measured band",
                      "expected": f"{band[0]}..{band[1]}", "got": round(got, 4), "max": most,
                      "counters": dict(view.got.counters)})
    replayed = _replay_findings(view)
    return found + (replayed or []), replayed is not None


def could_draft(view: PassView) -> bool:
    """Whether a pass had a step to draft in: some request decoded past its first token (the prefill's)."""
    return any(len(o.tokens) > 1 for o in view.got.outputs)


def _judge_counted(armed: Sequence[PassView]) -> Verdict:
    cold_counters = {v.workload: v.got.counters for v in armed if v.name == "cold"}
    judged = [_counted_findings(view, cold_counters) for view in armed]
    findings = [f for found, _ in judged for f in found]
    replayed = sum(was for _, was in judged)
    drafting = [v for v in armed if could_draft(v)]
    if drafting and not any(proposed(v.got.counters).get("drafts", 0) for v in drafting):  # the proposer never drafted
        findings.append({"workload": "every workload", "pass": "every pass", "check": "drafted",
                         "against": f"spec = {armed[0].traits.spec.method}", "expected": "> 0 drafts", "got": 0})
    means = [pass_accept_length(proposed(v.got.counters)) for v in armed]
    replays = f"; {replayed} of {len(armed)} passes replayed" if armed[0].traits.spec.replay is not None else ""
    if not armed[0].traits.spec.whole_drafts:
        replays += "; the step budget may cut drafts: only k + 1 as a bound"
    return verdict("accept_length", findings,
                   f"mean accept length {min(means):.3f}..{max(means):.3f} as expected{replays}",
                   lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['check']} vs "
                             f"{f[0]['against']}: {f[0].get('what') or 'mean accept length'} {f[0]['got']} "
                             f"(expected {f[0]['expected']})", armed)


def judge(views: Sequence[PassView]) -> Verdict:
    """Spec cells: accept length holds against golden-with-this-spec, warm against cold, the workload's measured
    band and the engine's own counters; each request drafted (and, for ngram, accepted) what it must."""
    armed = [v for v in views if "spec_golden" in v.references]
    if not armed:
        return Verdict("accept_length", "skip", "no speculative decoding")
    if all(v.traits.spec.pass_counted for v in armed):
        return _judge_counted(armed)
    cold = {v.workload: v.outputs for v in armed if v.name == "cold"}
    findings, means = [], []
    for view in armed:
        means.append(_mean_or_one(view.outputs))
        findings += _relative_findings(view, cold) + _band_findings(view) + _recount_findings(view)
        findings += _trace_findings(view)
    return verdict("accept_length", findings, f"mean accept length {min(means):.3f}..{max(means):.3f} as expected",
                   lambda f: f"{len(f)} finding(s); first: {f[0]['workload']}/{f[0]['pass']} {f[0]['check']} vs "
                             f"{f[0]['against']}: {f[0].get('what') or f[0].get('request') or 'mean accept length'} "
                             f"{f[0]['got']} (expected {f[0]['expected']})", views)


def script(views: Sequence[PassView], passes: Sequence[str]) -> dict:
    """A reproducer's check of accept length: the most a verify step can emit (k + 1) and the drop it tolerates."""
    return {"accept": {"max": views[0].traits.spec.max_accept_length, "tolerance": ACCEPT_TOLERANCE}}


#: shown as the accept-length histograms, got beside expected.
ORACLE = Oracle("accept_length", FAILS_WHEN, judge, evidence="accept", script=script)
