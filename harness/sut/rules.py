"""An engine's own rules, as the oracles judge it by them: how its prefix cache grants hits, and what it applied.

The cached tokens a request should get are the engine's to say, not the reference's: each engine package gives
its systems' ``CacheTraits`` a ``CacheRule`` (``harness.sut.base``), written from the engine's source or docs and
citing them. The rule sees only what the harness knows: the workload (prompts, rounds in order), the pass, what the
engine returned in each pass, and the levels the engine applied (its traits, and what it was read back to have
applied).

``PagedPrefixCache`` is the shared rule of a paged prefix cache (whole pages, the last prompt token always computed):
every engine's until its package states its own (``rule_of``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fixtures.workloads import CachedExpectation, Workload
from harness.sut.base import CacheRule, PassResult, Traits


@dataclass(frozen=True, slots=True)
class PagedPrefixCache:
    """A paged prefix cache: a tree (or hash chain) of whole pages of finished prompts, the last prompt token always
    computed, a hybrid model resuming only at a Mamba snapshot (``fixtures/workloads/expect.py`` states the bounds).

    ``model``: the engine is the reference, whose hits under pool pressure follow the independent cache model
    (``fixtures/workloads/cache_model.py``, written from ``reference_impl/cache/radix.py``'s stated rules): a
    sequential workload on a dense model without a proposer is then judged exactly, every tier. Otherwise a pass is
    judged within the workload's bounds: exact where nothing can be evicted, a band under pressure or concurrency.
    """

    model: bool = False
    name: str = "paged prefix cache: whole pages of finished prompts (fixtures/workloads/expect.py)"

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """The cold and warm passes get the workload's bounds. An isolation workload's second tenant must hit
        nothing at all, its second engine what the warm pass hits (from whichever tier). A cell that injects
        transport failures (PD) retries a request whose transfer failed, and the retry may hit the pages its first
        attempt computed: any pass may then reach what all prompts imply. A request aborted in the cold pass may
        have cached only part of its prompt: the warm pass must reach at least what the completed requests' prompts
        imply."""
        cache = traits.cache
        if not cache.enabled or name == "tenant":
            return disabled(workload, cache.page_size, "no prefix cache" if not cache.enabled else "another tenant")
        args = dict(page_size=cache.page_size, state_interval=cache.state_interval, hybrid=traits.hybrid,
                    chunk_size=cache.chunk_size, tiers=cache.tiers)
        # the cache model (exact for a sequential workload, dense, no proposer) knows one engine's cold and warm pass
        model = dict(exact=self.model and traits.spec.method == "none" and name in ("cold", "warm"),
                     decodes=not traits.pd)
        if not traits.aborts_allowed:
            expected = workload.expected_cached(**args, **model, warm=name != "cold")
            if name == "instance":
                expected = {rid: replace(e, host=None, storage=None) for rid, e in expected.items()}
            return {rid: replace(e, basis=self.name) for rid, e in expected.items()}
        ceiling = workload.expected_cached(**args, warm=True)
        completed = {o.rid for o in passes["cold"].outputs if o.finish_reason == "length"}
        floor = workload.expected_cached(**args, warm=True, cached_from=completed) if name != "cold" else None
        return {rid: CachedExpectation(floor[rid].lo if floor else 0, e.hi, e.page_size, None, None, basis=self.name)
                for rid, e in ceiling.items()}


def disabled(workload: Workload, page_size: int, why: str) -> dict[str, CachedExpectation]:
    """Every request hits nothing: the cache is off (or the pass is another tenant's)."""
    return {r.rid: CachedExpectation(0, 0, page_size, basis=why) for r in workload.requests}


#: the rule of an engine whose package states none of its own
SHARED = PagedPrefixCache()


def rule_of(traits: Traits) -> CacheRule:
    """The cache rule ``traits``' engine is judged by: its own, else the shared paged prefix cache's."""
    return traits.cache.rule or SHARED
