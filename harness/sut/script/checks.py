"""The check a reproducer script judges, on plain values, whatever the engine: what the oracle expected and what the
run with the failing setting got, beside the run with the setting toggled. The standard library alone, and vLLM's
NIXL byte rule that the pd_audit oracle judges by (``vllm_common.nixl``'s ``nixl_bytes``, copied in beside these).

A run is ``{"raised": "Type: message" or None, "passes": {"cold": pass, "warm": pass}}``, a pass
``{"outputs": [output], "audit": [problem], "nan_events": n}``, an output ``{"rid", "tokens", "logprobs", "margins",
"cached_tokens", "cached_host", "cached_storage", "finish_reason", "accepted", "drafted"}`` (engines that do not say
leave a key out); an engine that counts its verify steps instead of saying them gives a pass ``"spec": {"drafts",
"draft_tokens", "accepted_tokens"}``, a PD pair's pass its ledger ``"pd": {"bytes", "hit", "prompts", "block_size",
"block_bytes", "state_bytes"}`` (what NIXL moved into the decode side, that side's own prefix hit in tokens, the
prompts' lengths, its KV layout). ``CHECK`` (written into each script) names the oracle, its check, the passes
it failed in and what it needs: the requested lengths, tolerances, the cached tokens the engine's rule allows.

A script's exit status has one meaning each: 1 the bug shows, 0 it does not (fixed), ``CANNOT_JUDGE`` (2) it cannot
be judged here, always with one line on stderr that starts ``CANNOT JUDGE HERE:`` and says why: a package the script
needs is missing (``REQUIRES``), the CPU lacks a flag the finding needs (``NEEDS_CPU``: a kernel path the engine takes
only there), the engine would not start or a run raised something the finding did not record, or the script itself
raised. ``git bisect run`` reads 2 as "bad": map it to 125 ("skip") there.
"""
from __future__ import annotations

import importlib.util
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# a script carries these definitions beside these (``text.check_definitions``)
from ..host import flags_of
from ..vllm_common.nixl import nixl_bytes

#: the exit status of a script that cannot judge its finding here (never 1, which says the bug shows).
CANNOT_JUDGE = 2
#: how the one line that says why begins.
CANNOT_JUDGE_LINE = "CANNOT JUDGE HERE:"


def unjudged(why: str) -> int:
    """``CANNOT_JUDGE``, after one line on stderr saying ``why``."""
    print(f"{CANNOT_JUDGE_LINE} {why}", file=sys.stderr, flush=True)
    return CANNOT_JUDGE


def cannot_judge(why: str) -> NoReturn:
    """Exit ``CANNOT_JUDGE`` after one line on stderr saying ``why``."""
    raise SystemExit(unjudged(why))


def require(modules: list[str], install: str, needs_cpu: list[str], cpuinfo: str = "/proc/cpuinfo") -> None:
    """Return when this interpreter has every module in ``modules`` and this CPU every flag in ``needs_cpu``; else
    ``cannot_judge``, naming what is missing and how to install it (``install``): nothing run here could show the
    finding. A script calls this before it imports anything beside the standard library."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        cannot_judge(f"{' '.join(missing)} not installed for {sys.executable}; install: {install}")
    try:
        have = flags_of(Path(cpuinfo).read_text())
    except OSError:
        have = frozenset()
    lacking = [flag for flag in needs_cpu if flag not in have]
    if lacking:
        cannot_judge(f"this finding needs a CPU with {' '.join(needs_cpu)}; this CPU lacks {' '.join(lacking)} "
                     f"({cpuinfo}), so neither setting was run")


def judged(main: Callable[[], int]) -> int:
    """``main``'s exit status; an exception of the script's own (an engine's is caught where it runs and judged)
    prints its traceback and exits ``CANNOT_JUDGE``."""
    try:
        return main()
    except Exception as exc:  # noqa: BLE001 - whatever it is, it is no verdict on the bug
        traceback.print_exc()
        cannot_judge(f"the script itself raised {type(exc).__name__}: {exc} (traceback above)")


def _outputs(run: dict, name: str) -> list[dict]:
    return run["passes"].get(name, {}).get("outputs", [])


def _by_rid(run: dict, name: str) -> dict[str, dict]:
    return {out["rid"]: out for out in _outputs(run, name)}


def judge_completeness(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Every request finishes exactly once, with the tokens it asked for."""
    problems = []
    for name in check["passes"]:
        seen = {}
        for out in _outputs(failing, name):
            seen[out["rid"]] = seen.get(out["rid"], 0) + 1
            want = check["requested"].get(out["rid"])
            if want is not None and (out["finish_reason"] != "length" or len(out["tokens"]) != want):
                problems.append(f"{name} {out['rid']}: finished {out['finish_reason']!r} with {len(out['tokens'])} "
                                f"of {want} tokens")
        problems += [f"{name} {rid}: " + ("never finished (lost)" if not seen.get(rid) else
                                          f"finished {seen[rid]} times")
                     for rid in check["requested"] if seen.get(rid, 0) != 1]
    lengths = ", ".join(f"{rid} {n}" for rid, n in check["requested"].items())
    expected = f"every request finishes once with its length ({lengths})"
    return expected, "; ".join(problems) or "as expected", bool(problems)


def first_divergence(got: list, want: list) -> int | None:
    """The first step at which two token lists differ (over their common length), None when none does."""
    return next((step for step, (a, b) in enumerate(zip(got, want)) if a != b), None)


def judge_tokens(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Greedy tokens equal the toggled run's, except at a step where its top-2 margin is below the tie tolerance."""
    for name in check["passes"]:
        want = _by_rid(toggled, name)
        for out in _outputs(failing, name):
            ref = want.get(out["rid"])
            step = None if ref is None else first_divergence(out["tokens"], ref["tokens"])
            if step is not None and ref["margins"][step] >= check["tie"]:
                return (f"{name} {out['rid']}: {ref['tokens']} (as the toggled run)",
                        f"{out['tokens']} (first differs at step {step})", True)
    return "the toggled run's tokens", "as expected", False


def judge_logprobs(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Each token's logprob within the tolerance of the toggled run's, up to the first divergence."""
    for name in check["passes"]:
        want = _by_rid(toggled, name)
        for out in _outputs(failing, name):
            ref = want.get(out["rid"])
            if ref is None:
                continue
            stop = first_divergence(out["tokens"], ref["tokens"])
            for step, (got, exp) in enumerate(zip(out["logprobs"], ref["logprobs"])):
                if stop is not None and step >= stop:
                    break
                if not abs(got - exp) <= check["tolerance"]:
                    return (f"{name} {out['rid']} step {step}: logprob {exp:.6g} (as the toggled run, ± "
                            f"{check['tolerance']:g})", f"{got:.6g}", True)
    return "the toggled run's logprobs", "as expected", False


def _admits(allowed: dict, out: dict) -> bool:
    got = out["cached_tokens"]
    if "values" in allowed:
        ok = got in allowed["values"]
    else:
        ok = allowed["lo"] <= got <= allowed["hi"] and got % allowed["page"] == 0
    return ok and all(allowed.get(tier) in (None, out.get(f"cached_{tier}", 0)) for tier in ("host", "storage"))


def judge_cached_tokens(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Each request's cached prompt tokens as the engine's own cache rule allows (``CHECK["cached"]``)."""
    for name in check["passes"]:
        got = _by_rid(failing, name)
        for rid, allowed in check["cached"].get(name, {}).items():
            out = got.get(rid)
            if out is not None and not _admits(allowed, out):
                tiers = ", ".join(f"{t} {out.get(f'cached_{t}', 0)}" for t in ("host", "storage"))
                return f"{name} {rid}: {allowed['text']}", f"{out['cached_tokens']} ({tiers})", True
    return "the cached tokens the cache rule allows", "as expected", False


def judge_nan(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """No NaN or Inf anywhere: in the engine's sentinels or in a logprob."""
    for name in check["passes"]:
        events = failing["passes"].get(name, {}).get("nan_events", 0)
        bad = [out["rid"] for out in _outputs(failing, name) if not all(math.isfinite(x) for x in out["logprobs"])]
        if events or bad:
            return "no NaN or Inf", f"{name}: {events} NaN event(s), non-finite logprobs in {bad or 'none'}", True
    return "no NaN or Inf", "as expected", False


def judge_pool_audit(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """The idle engine's pools are whole after each pass: nothing leaked, nothing freed twice."""
    for name in check["passes"]:
        problems = failing["passes"].get(name, {}).get("audit", [])
        if problems:
            return "an idle engine's pools whole", f"{name}: {'; '.join(problems[:3])}", True
    return "an idle engine's pools whole", "as expected", False


def mean_accept_length(outputs: list[dict]) -> float:
    """Tokens emitted per verify step, bonus token included (steps that drafted nothing are not verify steps); 1.0
    without any verify step, as plain decoding."""
    steps = [(a, d) for out in outputs for a, d in zip(out.get("accepted", []), out.get("drafted", [])) if d > 0]
    return sum(a + 1 for a, _ in steps) / len(steps) if steps else 1.0


def spec_counts(run: dict, name: str) -> str:
    """A pass's speculative counters as a line: ``14 drafts, 28 draft tokens, 20 accepted``."""
    counts = run["passes"][name]["spec"]
    return f"{counts['drafts']} drafts, {counts['draft_tokens']} draft tokens, {counts['accepted_tokens']} accepted"


def judge_spec_counts(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """An engine that counts its verify steps instead of saying them per step (vLLM's metrics): each pass's drafts,
    draft tokens and accepted tokens equal the toggled run's, whose tokens are the same (a proposer's drafts are a
    function of the tokens, so a setting that changes no token changes no draft)."""
    for name in check["passes"]:
        if failing["passes"][name]["spec"] != toggled["passes"][name]["spec"]:
            return (f"{name}: {spec_counts(toggled, name)} (the toggled run's)", spec_counts(failing, name), True)
    return "the toggled run's speculative counters", "as expected", False


def judge_accept_length(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """A pass's mean accept length at most k + 1 and no more than the tolerance below the toggled run's (and, warm,
    below its own cold pass); an engine that only counts (its passes carry ``spec``) by ``judge_spec_counts``."""
    if all("spec" in run["passes"].get(name, {}) for run in (failing, toggled) for name in check["passes"]):
        return judge_spec_counts(check, failing, toggled)
    most, tolerance = check["accept"]["max"], check["accept"]["tolerance"]
    for name in check["passes"]:
        got = mean_accept_length(_outputs(failing, name))
        references = [("the toggled run", mean_accept_length(_outputs(toggled, name)))]
        if name == "warm":
            references.append(("its cold pass", mean_accept_length(_outputs(failing, "cold"))))
        for against, want in references:
            if got > most or got < want * (1 - tolerance):
                return (f"{name}: mean accept length at least {want * (1 - tolerance):.4g} ({against}'s {want:.4g} "
                        f"less {tolerance:.0%}), at most {most}", f"{got:.4g}", True)
    return "the toggled run's accept length", "as expected", False


def judge_pd_audit(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """PD's ``bytes``: what NIXL moved into the decode side each pass equals the blocks past its hit and the
    requests' states by its KV layout (the oracle's ``nixl_bytes``; the tokens it computes itself:
    ``CHECK["backoff"]``)."""
    for name in check["passes"]:
        ledger = failing["passes"].get(name, {}).get("pd")
        if ledger is not None:
            want, why = nixl_bytes(ledger["prompts"], check["backoff"], ledger["hit"], ledger["block_size"],
                                   ledger["block_bytes"], ledger["state_bytes"])
            if ledger["bytes"] != want:
                return f"{name}: NIXL moves {want} B ({why})", f"{ledger['bytes']} B", True
    return "NIXL moves every KV cache group's blocks past the decode side's hit", "as expected", False


def judge_inputs(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """The engine leaves its caller's inputs as it got them: each request's prompt, sampling parameters and priority
    compare equal after every call (an engine API that reaches no caller's object records no comparison); the
    finding's field alone where it names one (``CHECK["check"]``, a change's ``check``: its field without list
    positions; another field the engine changes is another bug)."""
    field = check.get("check")
    changes = [(name, change) for name, result in failing["passes"].items() for change in result.get("inputs", [])
               if field is None or change.get("check") == field]
    untouched = "every input as it was handed" if field is None else f"{field} as it was handed"
    got = "; ".join(f"{name} {c['request']} {c['field']}: {c['before']} -> {c['after']}" for name, c in changes[:3])
    return untouched, got or untouched, bool(changes)


def judge_error(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """The run with the failing setting raises ``CHECK["check"]``; the toggled one does not."""
    raised = failing["raised"]
    present = raised is not None and raised.split(":", 1)[0] == check["check"]
    return f"no exception (the toggled run: {toggled['raised'] or 'none'})", raised or "no exception", present


JUDGES = {"completeness": judge_completeness, "tokens": judge_tokens, "logprobs": judge_logprobs,
          "cached_tokens": judge_cached_tokens, "nan": judge_nan, "pool_audit": judge_pool_audit,
          "accept_length": judge_accept_length, "pd_audit": judge_pd_audit, "inputs": judge_inputs,
          "error": judge_error}


def describe(label: str, run: dict) -> str:
    """A run, a line per request (tokens, cached tokens, how it finished) and, speculating, each pass's accept
    length or counters; a PD pair, what NIXL moved each pass."""
    lines = [f"{label}:" + (f" raised {run['raised']}" if run["raised"] else "")]
    for name, result in run["passes"].items():
        if any(d for out in result["outputs"] for d in out.get("drafted", [])):
            lines.append(f"  {name:4} mean accept length {mean_accept_length(result['outputs']):.4g}")
        if result.get("spec", {}).get("drafts"):
            lines.append(f"  {name:4} {spec_counts(run, name)}")
        if "pd" in result:
            pd = result["pd"]
            lines.append(f"  {name:4} NIXL moved {pd['bytes']} B into the decode side (its own hit {pd['hit']} tokens; "
                         f"{pd['block_bytes']} B a {pd['block_size']}-token block, {pd['state_bytes']} B a state)")
            if pd.get("nixl_expired_leases") or pd.get("nixl_reads_after_expiry"):
                lines.append(f"  {name:4} the prefill side freed {pd['nixl_expired_leases']} request(s)' blocks unread "
                             f"when their lease ran out, and heard of {pd['nixl_reads_after_expiry']} read(s) after")
        for out in result["outputs"]:
            tokens = out["tokens"] if len(out["tokens"]) <= 12 else out["tokens"][:12] + ["…"]
            lines.append(f"  {name:4} {out['rid']}: {out['finish_reason']}, cached {out.get('cached_tokens', '?')}, "
                         f"tokens {tokens}")
    return "\n".join(lines)


#: checks that judge the failing run on its own (the toggled run is printed beside it, not compared with).
INVARIANTS = ("completeness", "cached_tokens", "nan", "pool_audit", "pd_audit", "inputs", "error")
#: of those, the ones that hold whatever the setting: the toggled run is judged by them too, and a note says so where
#: it fails one (cached_tokens' allowed hits are the failing setting's cache rule's, not the toggled one's).
SETTING_FREE = ("completeness", "nan", "pool_audit", "pd_audit", "inputs", "error")


def reproduce(check: dict, failing: dict, toggled: dict, setting: str) -> int:
    """Print both runs and the check's expected against got; the exit status: 1 while the failure shows with the
    failing setting, 0 once it does not, ``CANNOT_JUDGE`` when a run raised something other than the failure
    recorded (the engine's own traceback or log tail is printed above, where it ran)."""
    print(describe(f"with {setting}", failing))
    print(describe("toggled", toggled))
    judge = JUDGES[check["oracle"]]
    expected, got, present = judge(check, failing, toggled)
    print(f"check: {check['oracle']}" + (f" ({check['check']})" if check.get("check") else ""))
    print(f"expected: {expected}")
    print(f"got:      {got}")
    if toggled["raised"]:
        return unjudged(f"the toggled run raised {toggled['raised']}, so nothing compares the run with {setting}")
    if failing["raised"] and not (check["oracle"] == "error" and present):
        return unjudged(f"the run with {setting} raised {failing['raised']}, which the finding did not record"
                        + (f" (it records {check['check']})" if check["oracle"] == "error" else ""))
    if present and check["oracle"] in SETTING_FREE and judge(check, toggled, toggled)[2]:
        print("note: the toggled run fails this check too")
    print("BUG PRESENT" if present else "FIXED: the check passes with the failing setting")
    return 1 if present else 0
