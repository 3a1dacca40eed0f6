"""What an oracle reads, and what it returns.

An oracle (``Oracle``) looks at every workload and every pass of one cell, each as a ``PassView``: what the
system served in that pass, the engine's ``Traits`` (its levels as it applied them), the references the pass is
held to (the golden run, the golden run with the cell's proposer, another engine's golden on the same
weights, the same requests run alone or cold) and what the cell is expected to show. It returns one
``Verdict`` whose detail names what a person needs to act: workload, pass, request, step, expected, got. An
oracle fails on silent damage only; an exception in the cell is an ``error`` status decided by the runner.
"""
from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fixtures.workloads import CachedExpectation
from harness.results.rows import Verdict
from harness.sut.base import PassResult, Traits
from reference_impl.request import RequestOutput, RequestSpec

#: the passes every workload runs: cold, then warm on the same system (an isolation workload adds more).
PASSES = ("cold", "warm")
#: the references a pass may be held to, by name (``PassView.references``).
REFERENCES = {
    "golden": "the golden cell's cold pass (the matrix's golden levels, this cell's model)",
    "spec_golden": "the golden levels with this cell's proposer (spec cells)",
    "cross_engine": "another engine's golden on the same weights (a real engine's cell)",
    "solo": "each request of the cold pass run alone, on a plain engine (deterministic mode)",
    "cold": "this cell's own cold pass (every later pass)",
}
#: top-2 logit margin under which a greedy divergence is a tie, per dtype.
TIE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.125, torch.float16: 0.02}
#: largest per-token logprob difference accepted against the golden run, per dtype.
LOGPROB_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.02}
MAX_FINDINGS = 5


@dataclass(frozen=True, slots=True)
class KnownFailure:
    """A declared known failure (``[[expected]] #number``) as the oracles apply it: it excuses the findings of the
    oracles it ``fails`` whose fields match ``signature`` (every finding of theirs without one), and nothing else:
    the same oracle still fails on any other damage in the cell."""

    number: int
    fails: tuple[str, ...]
    #: finding field → the values that match, or the ``harness.matrix.model.Bound`` a number lies in
    signature: tuple[tuple[str, Container[object]], ...] = ()

    def excuses(self, oracle: str, finding: Mapping[str, object]) -> bool:
        return oracle in self.fails and all(finding.get(key, _ABSENT) in values for key, values in self.signature)


_ABSENT = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class PassView:
    """One pass of one workload as an oracle sees it."""

    workload: str
    name: str                              # "cold", "warm" (an isolation workload: "tenant", "instance")
    requests: tuple[RequestSpec, ...]      # what was submitted
    got: PassResult                        # what the system served: outputs, NaN events, audit, counters, PD ledger
    traits: Traits                         # the engine's levels as it applied them
    references: Mapping[str, PassResult]   # by ``REFERENCES`` name; only those that apply to this pass
    expected_cached: Mapping[str, CachedExpectation] = field(default_factory=dict)  # rid → allowed cached_tokens
    #: a PD pass whose decode side's own prefix hit is not the client's (the prefill side's): rid → the decode side's
    #: allowed hit (None: the client's, ``expected_cached``)
    decode_cached: Mapping[str, CachedExpectation] | None = None
    tolerances: Mapping[str, float] = field(default_factory=dict)  # declared for the cell's levels: logprobs, tie
    accept_band: tuple[float, float] | None = None  # the workload's measured mean accept length for this proposer
    known: tuple[KnownFailure, ...] = ()   # the cell's declared known failures: the findings they excuse

    @property
    def outputs(self) -> list[RequestOutput]:
        return self.got.outputs

    @property
    def golden(self) -> list[RequestOutput]:
        return self.references["golden"].outputs

    @property
    def requested(self) -> dict[str, int]:
        """rid → the tokens it asked for."""
        return {r.rid: r.max_new_tokens for r in self.requests}

    @property
    def prompts(self) -> dict[str, tuple[int, ...]]:
        return {r.rid: r.prompt for r in self.requests}

    def reference(self, name: str) -> list[RequestOutput] | None:
        """The outputs of reference ``name``, None when it does not apply to this pass."""
        found = self.references.get(name)
        return None if found is None else found.outputs

    def tie(self) -> float:
        """The top-2 margin under which a divergence is a tie: declared for the cell's levels, else the dtype's."""
        return self.tolerances.get("tie", TIE_TOLERANCE[self.traits.dtype])

    def logprob_tol(self) -> float:
        """The largest logprob difference accepted: declared for the cell's levels, else the dtype's."""
        return self.tolerances.get("logprobs", LOGPROB_TOLERANCE[self.traits.dtype])

    def excused(self, oracle: str, finding: Mapping[str, object]) -> bool:
        """Whether a declared known failure of the cell excuses ``finding`` of ``oracle``."""
        return any(known.excuses(oracle, finding) for known in self.known)

    def where(self) -> dict[str, str]:
        """The start of every finding about this pass."""
        return {"workload": self.workload, "pass": self.name}


Judge = Callable[[Sequence[PassView]], Verdict]
#: what a reproducer script's ``CHECK`` needs beyond the common keys, from the failing run's passes (seen with no
#: references: ``PassView.golden`` is not there) and the names of the passes the check failed in.
Script = Callable[[Sequence[PassView], Sequence[str]], dict]


@dataclass(frozen=True, slots=True)
class Oracle:
    """One oracle: its name (a key of every row's ``oracles``), what fails it (one line, for ``harness oracles`` and
    the docs), the function that judges a cell's views, and how its findings are shown and reproduced: the kind of
    report view they fit (``reports.evidence.KINDS``; None: a table), what a reproducer script's check needs from
    the run (``Script``) and the checks a script can judge (None: every one)."""

    name: str
    fails_when: str
    judge: Judge
    evidence: str | None = None
    script: Script | None = None
    script_checks: frozenset[str] | None = None

    def __call__(self, views: Sequence[PassView]) -> Verdict:
        return self.judge(views)


def verdict(oracle: str, findings: list[dict], ok_message: str, fail_message: Callable[[list[dict]], str],
            views: Sequence[PassView] = ()) -> Verdict:
    """``fail`` with the first findings as evidence when any is left once the cell's declared known failures have
    excused theirs (counted per declaration), else ``pass`` with the first excused findings as its evidence (each
    naming the ``[[expected]]`` entry that excused it: what an xfail cell's declaration covered, to read and bound)."""
    known = views[0].known if views else ()
    kept, excused, shown = [], {}, []
    for finding in findings:
        by = next((k.number for k in known if k.excuses(oracle, finding)), None)
        if by is None:
            kept.append(finding)
        else:
            excused[by] = excused.get(by, 0) + 1
            shown.append({"excused_by": by, **finding})
    note = "; excused as declared: " + ", ".join(f"{n} by [[expected]] #{k}" for k, n in excused.items()) if excused else ""
    if kept:
        return Verdict(oracle, "fail", fail_message(kept) + note, kept[:MAX_FINDINGS], excused)
    return Verdict(oracle, "pass", ok_message + note, shown[:MAX_FINDINGS], excused)


def with_ties(result: Verdict, ties: Sequence[dict]) -> Verdict:
    """A passing token verdict's evidence: what its declarations excused first, then the divergences it let pass as
    ties (each marked ``tie``), as many as a verdict shows."""
    if ties and result.status == "pass":
        result.detail = (result.detail + [{"tie": True, **t} for t in ties])[:MAX_FINDINGS]
    return result


def tolerances_script(views: Sequence[PassView], passes: Sequence[str]) -> dict:
    """A reproducer's check of tokens or logprobs: the tie and logprob tolerances the oracles judged the run by."""
    return {"tie": views[0].tie(), "tolerance": views[0].logprob_tol()}


def first_divergence(got: Sequence[object], want: Sequence[object]) -> int | None:
    """The first index at which the two sequences differ (over their common length), None when none does."""
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return step
    return None
