"""inputs: the engine leaves what its caller hands it as it got it (prompt lists, sampling parameters, requests).

An engine API that changes its caller's inputs in place damages the caller's next use of them silently: the warm pass
serves the same requests again, a caller shares one ``SamplingParams`` between requests. Each pass's result carries one
``InputsCheck`` per API the inputs went through (``harness.sut.inputs``): ``serve``, the rounds the runner hands every
engine (the reference engine's API takes those requests themselves); ``LLM.generate`` in the vLLM child, its prompts,
``SamplingParams`` and priorities, compared in that process, where vLLM runs and could write them; a server's request
bodies, where the server is another process and cannot write the caller's memory at all: there what is judged is the
harness's own client path (building, sending, the PD handoff), and the verdict says so. Skipped where no pass compared
anything.
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles.view import MAX_FINDINGS, Oracle, PassView, verdict
from harness.results.rows import Verdict
from harness.sut.base import PassResult

#: what fails this oracle, one line (``harness oracles``, docs/reference/oracles.md).
FAILS_WHEN = (
    "an input the caller handed an engine API differs after the call from a deep snapshot taken before it (the rounds "
    "of requests every engine's `serve` gets; vLLM's prompts, `SamplingParams` and priorities in its child; a server's "
    "request bodies, where only the harness's own client can write them: the server is another process), naming the "
    "request, the field, before and after; skipped where nothing was compared"
)


def judge(views: Sequence[PassView]) -> Verdict:
    """Every change any call made to its inputs is a finding; the calls compared are counted, with who held them."""
    findings: list[dict] = []
    counted: dict[tuple[str, str], int] = {}
    for view in views:
        passes: list[tuple[str, PassResult]] = [(view.name, view.got)]
        if "solo" in view.references:  # the cell's own engine, each request alone
            passes.append(("alone", view.references["solo"]))
        for name, result in passes:
            for check in result.inputs:
                counted[check.call, check.where] = counted.get((check.call, check.where), 0) + check.compared
                # each change names its check, its field without list positions (``harness repro --check``)
                findings += [{"workload": view.workload, "pass": name, "call": check.call, **change}
                             for change in check.changes]
    if not counted:
        return Verdict("inputs", "skip", "no pass compared the inputs it handed the engine")
    shown = "; ".join(f"{call}: {n} requests ({where})" for (call, where), n in counted.items())
    return verdict("inputs", findings, f"every input left as handed: {shown}", failed, views)


def failed(findings: list[dict]) -> str:
    """How many inputs changed, in which calls and fields (a row shows only the first findings), and the first."""
    first, fields = findings[0], list(dict.fromkeys(f"{f['call']} {f['field']}" for f in findings))
    named = "; ".join(fields[:MAX_FINDINGS]) + (f"; {len(fields) - MAX_FINDINGS} more fields" if len(fields) > MAX_FINDINGS else "")
    return (f"{len(findings)} input change(s) in {named}; first: {first['workload']}/{first['pass']} "
            f"{first['call']} request {first['request']}: {first['field']} was {first['before']}, after the call "
            f"{first['after']}")


ORACLE = Oracle("inputs", FAILS_WHEN, judge)
