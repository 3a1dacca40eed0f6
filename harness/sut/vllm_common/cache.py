"""How vLLM's prefix cache grants hits where the shared paged rule does not say it: with an EAGLE proposer, under KV
pressure, over NIXL on a hybrid, from ExampleConnector's disk tier; ``cache_rule`` picks a cell's. Each wraps another
rule (the shared one, or a tier's) and cites the vLLM source it models.

EAGLE: the head reads token j + 1 at position j, so its KV at a block's last position depends on the token after
the block, which the block's hash does not cover; vLLM recomputes the last matched block (PR #17137):
``find_longest_cache_hit`` in ``vllm/v1/core/single_type_kv_cache_manager.py`` ("if drop_eagle_block and hit_length >
0: hit_length -= min(alignment_tokens, block_size)"; ``use_eagle`` is set for EAGLE and MTP proposers, not for a
draft model). A request that the paged rule grants m whole blocks gets max(0, m - 1) of them. The rule is the
engine's for any hit: a KV connector's (ExampleConnector's lookup applies none) is held to it too, and a hit that
keeps the block is a finding (``findings/vllm-eagle-connector-keeps-block``), not a second rule.

Pressure: a freed block keeps its hash until it is handed out again, and the free queue hands out the least
recently used first (``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py``; ``BlockPool
._maybe_evict_cached_block``), so in a cache too small for the workload any cached block may be gone when a later
request looks it up: a hit is anything from nothing up to what the paged rule grants, never more.

A NIXL pair on a Mamba hybrid: the client's cached tokens are the prefill side's hit (``pd.py``), and the prefill side
serves each prompt less its last token (``_truncate_request_for_prefill`` in
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py``, called from ``on_new_request``, before the
prefix-cache lookup since vLLM PR #53523), whose hit in turn leaves one token to compute (``KVCacheManager
.get_computed_blocks``: ``max_cache_hit_length = request.num_tokens - 1``): an (n·block + 1)-token prompt may hit one
block fewer there than alone. The decode side looks its own cache up with the whole prompt, and reads from the
prefill side only what lies past its hit and short of the last token (``NixlPullConnectorScheduler
.get_num_new_matched_tokens``: ``_get_remote_prefill_token_count(len) - num_computed_tokens``, nothing when not
positive): such a prompt, hit to its last token there, moves nothing at all, not even its Mamba state
(``NixlPullConnectorWorker._read_blocks``: "Full prefix cache hit: do not need to read remote blocks, just notify P
worker"). pd_audit holds the decode side to the inner rule (``decode_side``) and counts those requests' transfers.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fixtures.workloads import CachedExpectation, Workload, best_hit
from harness.sut.base import CacheRule, PassResult, Traits
from harness.sut.rules import SHARED
from reference_impl.request import RequestSpec


@dataclass(frozen=True, slots=True)
class _Adjusted:
    """Another rule's hits (``inner``: the shared paged rule's, or a tier's), each adjusted by ``adjust``."""

    inner: CacheRule = field(default=SHARED)
    name: str = ""

    def adjust(self, expected: CachedExpectation) -> CachedExpectation:
        raise NotImplementedError

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """rid → the inner rule's allowed cached tokens, adjusted, on this rule's basis and the inner one's."""
        return {rid: replace(self.adjust(e), basis=f"{self.name}; {e.basis}")
                for rid, e in self.inner.expected(workload, traits, name, passes).items()}


@dataclass(frozen=True, slots=True)
class EagleDropsLastBlock(_Adjusted):
    """One block fewer wherever there is one (never below 0)."""

    name: str = ("vLLM with an EAGLE proposer recomputes the last matched block "
                 "(vllm/v1/core/single_type_kv_cache_manager.py, find_longest_cache_hit, drop_eagle_block)")

    def adjust(self, expected: CachedExpectation) -> CachedExpectation:
        block = expected.page_size
        values = None if expected.values is None else tuple(sorted({max(0, v - block) for v in expected.values}))
        return replace(expected, lo=max(0, expected.lo - block), hi=max(0, expected.hi - block), values=values)


@dataclass(frozen=True, slots=True)
class EvictedUnderPressure(_Adjusted):
    """The hits as a ceiling: under KV pressure vLLM may have evicted any of them (any tier's share left free)."""

    name: str = ("vLLM under KV pressure evicts least recently used cached blocks "
                 "(vllm/v1/core/kv_cache_utils.py, FreeKVCacheBlockQueue): at most the paged rule's hit")

    def adjust(self, expected: CachedExpectation) -> CachedExpectation:
        return replace(expected, lo=0, values=None, host=None, storage=None)


@dataclass(frozen=True, slots=True)
class PrefillSideShort:
    """A NIXL pair on a Mamba hybrid: the client sees the prefill side's hit, on each prompt less its last ``backoff``
    tokens (``nixl_backoff``), by ``inner``; the decode side's own hit is ``inner``'s on the whole prompts."""

    inner: CacheRule = field(default=SHARED)
    backoff: int = 1
    name: str = ("vLLM's NIXL prefill side serves a Mamba hybrid's prompt less its last token "
                 "(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py, _truncate_request_for_prefill, "
                 "from on_new_request, before the prefix-cache lookup)")

    @property
    def decode_side(self) -> CacheRule:
        """The rule the decode side's own prefix cache grants hits by: the whole prompt's."""
        return self.inner

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """rid → the inner rule's allowed cached tokens on the prompts the prefill side serves."""
        short = replace(workload, requests=tuple(shortened(r, self.backoff) for r in workload.requests))
        return {rid: replace(e, basis=f"{self.name}; {e.basis}")
                for rid, e in self.inner.expected(short, traits, name, passes).items()}


def shortened(request: RequestSpec, backoff: int) -> RequestSpec:
    """``request`` as vLLM's NIXL prefill side serves it: less its last ``backoff`` prompt tokens, where it has more
    than that (``_truncate_request_for_prefill``: ``request.num_prompt_tokens > backoff``)."""
    if not backoff or len(request.prompt) <= backoff:
        return request
    return replace(request, prompt=request.prompt[:-backoff])


def example_tier_hit(prompt_tokens: int, block_size: int) -> int:
    """Tokens of a prompt that ``ExampleConnector`` keys and saves it by, so that a later lookup of the same prompt
    loads them: ``ReqMeta.make_meta`` aligns ``len(prompt)`` by ``align_to_block_size`` (``(n - 1) // block *
    block``), the prefix cache's own rule (whole blocks, short of the last token). Its lookup
    (``get_num_new_matched_tokens``, ``_found_match_for_prompt``, which also decides whether a prompt is saved) aligns
    ``len - 1``, one block less where ``len - 1`` is a multiple of the block, so such a prompt neither finds its own
    key nor is saved under it. The connector's two paths disagree: the save path's rule is expected, the lookup's
    shortfall is a finding (``findings/vllm-example-connector-false-hit``), not a rule to copy."""
    return max(prompt_tokens - 1, 0) // block_size * block_size


def nixl_backoff(hybrid: bool) -> int:
    """Prompt tokens the decode side computes itself instead of reading them: none on an attention model, one on a
    Mamba hybrid, whose decoder needs the state h(N - 1) (``nixl/base_scheduler.py``, ``_prefill_backoff`` and
    ``_truncate_request_for_prefill``: the prefill side stops that many tokens short)."""
    return 1 if hybrid else 0


@dataclass(frozen=True, slots=True)
class ExampleConnectorTier:
    """How a ``cache = storage`` cell's hits are granted (its ``CacheTraits.rule``): the cold pass starts from an empty
    tier and follows the shared page rule, the tier's share left free (a later round may load a key an earlier one
    stored, and vLLM reports no per-request split); every later pass follows a device-cache reset, so each request
    loads at least what the connector saved of its own prompt (``example_tier_hit``: the save path's rule, which is
    the prefix cache's), and at most that or what the pass's other prompts share with it in whole blocks (the device
    cache, refilled within the pass). No host tier: its share is 0."""

    name: str = ("ExampleConnector's disk tier: a prompt saved as its whole blocks short of the last token "
                 "(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py, make_meta), the device cache "
                 "above it")

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """rid → the cached tokens allowed in pass ``name``."""
        pages = SHARED.expected(workload, traits, name, passes)
        if traits.pressed and name == "cold":  # a preempted request is recomputed: it may load its own saved key
            own = {r.rid: example_tier_hit(len(r.prompt), pages[r.rid].page_size) for r in workload.requests}
            return {rid: replace(e, hi=max(e.hi, own[rid]), host=0, storage=None, basis=self.name)
                    for rid, e in pages.items()}
        if name == "cold" or traits.aborts_allowed or not traits.cache.enabled:
            return {rid: replace(e, host=0, storage=None, basis=self.name) for rid, e in pages.items()}
        expected = {}
        for request in workload.requests:
            page = pages[request.rid]
            tier = example_tier_hit(len(request.prompt), page.page_size)
            others = [r.prompt for r in workload.requests if r is not request]
            device = best_hit(request.prompt, others, page_size=page.page_size, state_interval=page.page_size,
                              hybrid=False)
            expected[request.rid] = CachedExpectation(tier, max(tier, device), page.page_size, host=0, storage=None,
                                                      basis=self.name)
        return expected


def cache_rule(levels: Mapping[str, object], drops_eagle_block: bool | None = None) -> CacheRule | None:
    """The rule a vLLM cell's hits are judged by: a disk tier's or the shared paged rule, one block fewer where vLLM
    drops the last matched block for an EAGLE head (``drops_eagle_block``: as read back from the engine; None: as the
    levels ask, spec = eagle without eagle_block_drop = off; the prefix cache applies it, and a connector's hit is
    held to it as well), then a ceiling only in a tight KV cache, all on the prompts a NIXL pair's prefill side
    serves (a Mamba hybrid's one token short: ``PrefillSideShort``); None for the shared paged rule."""
    if drops_eagle_block is None:
        drops_eagle_block = levels["spec"] == "eagle" and levels.get("eagle_block_drop", "on") == "on"
    rule = ExampleConnectorTier() if levels["cache"] == "storage" else None
    if drops_eagle_block:
        rule = EagleDropsLastBlock(rule or SHARED)
    rule = EvictedUnderPressure(rule or SHARED) if levels["kv_capacity"] == "tight" else rule
    backoff = nixl_backoff(levels["model"] == "hybrid") if levels.get("pd", "off") == "nixl" else 0
    return PrefillSideShort(rule or SHARED, backoff) if backoff else rule
