"""The judge stage: each pass of a cell's workload runs seen as the oracles see them (``PassView``), against the
references the plan named, with what the workload and the engine's traits imply; then every oracle's verdict."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fixtures.spec_expect import accept_band
from fixtures.workloads import CachedExpectation
from harness import oracles
from harness.oracles.view import PASSES, KnownFailure, PassView
from harness.results.rows import Verdict
from harness.run.serve import WorkloadRun
from harness.sut.base import PassResult


def expected_cached(run: WorkloadRun, name: str) -> dict[str, CachedExpectation]:
    """The workload's cached-token expectation for one pass of ``run``.

    The cold and warm passes get the workload's bounds. An isolation workload's second tenant must hit
    nothing at all, its second engine what the warm pass hits (from whichever tier). A cell that injects
    transport failures (PD) retries a request whose transfer failed, and the retry may hit the pages its
    first attempt computed: any pass may then reach what all prompts imply. A request aborted in the cold
    pass may have cached only part of its prompt: the warm pass must reach at least what the completed
    requests' prompts imply. An engine whose cache keys a tier otherwise gives its own rule (``CacheTraits.rule``),
    applied last.
    """
    traits, cache = run.traits, run.traits.cache
    if not cache.enabled or name == "tenant":
        return {r.rid: CachedExpectation(0, 0, cache.page_size) for r in run.workload.requests}
    args = dict(page_size=cache.page_size, state_interval=cache.state_interval, hybrid=traits.hybrid,
                chunk_size=cache.chunk_size, tiers=cache.tiers)
    # the cache model (exact for a sequential workload, dense, no proposer) knows one engine's cold and warm pass
    model = dict(exact=cache.model_cache and traits.spec.method == "none" and name in PASSES, decodes=not traits.pd)
    if not traits.aborts_allowed:
        expected = run.workload.expected_cached(**args, **model, warm=name != "cold")
        if name == "instance":
            return {rid: replace(e, host=None, storage=None) for rid, e in expected.items()}
        return expected if cache.rule is None else cache.rule(run.workload, name, expected)
    ceiling = run.workload.expected_cached(**args, warm=True)
    completed = {o.rid for o in run.passes["cold"].outputs if o.finish_reason == "length"}
    floor = run.workload.expected_cached(**args, warm=True, cached_from=completed) if name != "cold" else None
    return {rid: CachedExpectation(floor[rid].lo if floor else 0, e.hi, e.page_size, None, None)
            for rid, e in ceiling.items()}


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
                              tolerances=dict(tolerances), accept_band=band, known=known))
    return views


def judge(views: Sequence[PassView]) -> dict[str, Verdict]:
    """Every registered oracle's verdict on a cell's views."""
    return oracles.judge(views)
