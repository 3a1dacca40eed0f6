"""The judge stage: each pass of a cell's workload runs seen as the oracles see them (``PassView``), against the
references the plan named, with what the workload and the engine's traits imply; then every oracle's verdict."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from fixtures.spec_expect import accept_band
from fixtures.workloads import CachedExpectation
from harness import oracles
from harness.oracles.view import KnownFailure, PassView
from harness.results.rows import Verdict
from harness.run.serve import WorkloadRun
from harness.sut.base import PassResult
from harness.sut.rules import rule_of


def expected_cached(run: WorkloadRun, name: str) -> dict[str, CachedExpectation]:
    """The cached-token expectation for one pass of ``run``: the engine's own rule says it (``CacheTraits.rule``)."""
    return rule_of(run.traits).expected(run.workload, run.traits, name, run.passes)


def decode_cached(run: WorkloadRun, name: str) -> dict[str, CachedExpectation] | None:
    """A PD pass's decode side: what its own prefix cache should hit, where the engine's rule names it apart from the
    client's (the rule's ``decode_side``: vLLM's NIXL pair on a Mamba hybrid, whose client sees the prefill side's hit
    on prompts one token short); None where the client's expectation is the decode side's too."""
    side = getattr(rule_of(run.traits), "decode_side", None)
    if side is None or not run.traits.pd:
        return None
    return side.expected(run.workload, run.traits, name, run.passes)


def pass_views(run: WorkloadRun, references: Mapping[str, WorkloadRun], tolerances: Mapping[str, float],
               known: tuple[KnownFailure, ...] = ()) -> list[PassView]:
    """Every pass of ``run`` as the oracles see it: held to the cold pass of each reference run (``golden``,
    ``spec_golden``, ``cross_engine``), to each request alone (the cold pass) or to its own cold pass (later ones),
    with the cell's declared known failures (``known``)."""
    traits, workload = run.traits, run.workload
    held_to = {name: reference.passes["cold"] for name, reference in references.items()}
    band = accept_band(workload.name, traits.model, traits.spec.method, traits.spec.k)
    views = []
    for name, result in run.passes.items():
        own: dict[str, PassResult] = {"cold": run.passes["cold"]} if name != "cold" else {}
        if name == "cold" and run.solo is not None:
            own["solo"] = run.solo
        views.append(PassView(workload=workload.name, name=name, requests=tuple(workload.requests), got=result,
                              traits=traits, references={**held_to, **own}, expected_cached=expected_cached(run, name),
                              decode_cached=decode_cached(run, name),
                              tolerances=dict(tolerances), accept_band=band, known=known))
    return views


def judge(views: Sequence[PassView]) -> dict[str, Verdict]:
    """Every registered oracle's verdict on a cell's views."""
    return oracles.judge(views)
