"""vLLM's own cache rules: one block fewer with EAGLE, a ceiling only under KV pressure."""
from __future__ import annotations

import pytest

from fixtures.workloads import CachedExpectation, load_workload
from harness.oracles import oracles
from harness.sut.rules import SHARED
from harness.sut.vllm import LEVELS
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm_common.cache import EagleDropsLastBlock, EvictedUnderPressure
from tests.harness.oracles.test_oracles import output, view

ORACLES = oracles()


def test_an_eagle_cell_expects_one_block_fewer_than_the_paged_rule() -> None:
    traits = vllm_traits(LEVELS.full({"cache": "device", "spec": "eagle", "page_size": 32}))
    assert isinstance(traits.cache.rule, EagleDropsLastBlock)
    workload = load_workload("system_prompt")
    paged = SHARED.expected(workload, traits, "warm", {})
    eagle = traits.cache.rule.expected(workload, traits, "warm", {})
    assert any(e.hi >= 64 for e in paged.values())  # a request with two whole blocks or more, so the rule bites
    for rid, e in paged.items():
        assert (eagle[rid].lo, eagle[rid].hi) == (max(0, e.lo - 32), max(0, e.hi - 32))
        assert "drop_eagle_block" in eagle[rid].basis


def test_listed_values_lose_a_block_each_and_a_single_block_hit_becomes_none() -> None:
    class Listed:
        name = "listed"

        def expected(self, workload, traits, name, passes):
            return {"r": CachedExpectation(32, 96, 32, values=(32, 96), basis="listed")}

    got = EagleDropsLastBlock(Listed()).expected(None, None, "warm", {})["r"]
    assert (got.lo, got.hi, got.values) == (0, 64, (0, 64))


def test_eagle_block_drop_off_asks_vllm_to_keep_the_block_and_is_judged_by_what_vllm_applied() -> None:
    """eagle_block_drop = off is vLLM's disable_eagle_block_drop: the paged rule's whole hit is expected, and the rule
    follows the drop as read back from the engine, whichever was asked."""
    from harness.sut.vllm.arguments import engine_arguments
    from harness.sut.vllm_common.applied import applied_traits, read_back

    levels = LEVELS.full({"cache": "device", "spec": "eagle", "eagle_block_drop": "off"})
    arguments = engine_arguments(levels, {})
    assert arguments["speculative_config"]["disable_eagle_block_drop"] is True
    assert "disable_eagle_block_drop" not in engine_arguments({**levels, "eagle_block_drop": "on"}, {})["speculative_config"]
    traits = vllm_traits(levels, arguments)
    assert traits.cache.rule is None
    applied = read_back(arguments, {"drops_eagle_block": True})  # an engine that dropped it all the same
    (drop,) = applied
    assert (drop.what, drop.asked, drop.used) == ("eagle_block_drop", False, True) and drop.defeats
    assert isinstance(applied_traits(traits, applied, levels).cache.rule, EagleDropsLastBlock)


def test_other_proposers_keep_the_paged_rule() -> None:
    for spec in ("none", "ngram", "draft", "self"):
        assert vllm_traits(LEVELS.full({"cache": "device", "spec": spec})).cache.rule is None


def test_a_tight_cell_allows_anything_up_to_the_paged_hit() -> None:
    traits = vllm_traits(LEVELS.full({"cache": "device", "kv_capacity": "tight", "spec": "eagle"}))
    assert isinstance(traits.cache.rule, EvictedUnderPressure) and isinstance(traits.cache.rule.inner, EagleDropsLastBlock)
    workload = load_workload("templated")
    ceiling = traits.cache.rule.inner.expected(workload, traits, "warm", {})
    for rid, e in traits.cache.rule.expected(workload, traits, "warm", {}).items():
        assert (e.lo, e.hi) == (0, ceiling[rid].hi) and "FreeKVCacheBlockQueue" in e.basis


def test_a_storage_cell_with_eagle_holds_the_tiers_hit_to_the_eagle_drop_and_a_pressed_cold_pass_may_load_its_key(
        ) -> None:
    """vLLM's EAGLE drop is its rule for any hit, the tier's too (ExampleConnector's lookup applies none: the finding
    it makes is judged, not copied); under pressure a preempted request is recomputed and may load the key it saved
    in the same pass, less that block."""
    from harness.sut.vllm_common.cache import ExampleConnectorTier, example_tier_hit

    traits = vllm_traits(LEVELS.full({"cache": "storage", "spec": "eagle", "kv_capacity": "tight", "page_size": 64}))
    rule = traits.cache.rule
    assert isinstance(rule, EvictedUnderPressure) and isinstance(rule.inner, EagleDropsLastBlock)
    assert isinstance(rule.inner.inner, ExampleConnectorTier)
    workload = load_workload("repeated_phrases")
    cold = rule.expected(workload, traits, "cold", {})
    assert all(cold[r.rid].hi >= example_tier_hit(len(r.prompt), 64) - 64 for r in workload.requests)
    roomy = vllm_traits(LEVELS.full({"cache": "storage", "spec": "eagle", "page_size": 32}))
    tier = ExampleConnectorTier().expected(load_workload("system_prompt"), roomy, "warm", {})
    dropped = roomy.cache.rule.expected(load_workload("system_prompt"), roomy, "warm", {})
    assert {rid: (e.lo, e.hi) for rid, e in dropped.items()} == \
        {rid: (max(0, e.lo - 32), max(0, e.hi - 32)) for rid, e in tier.items()}


@pytest.mark.parametrize(("levels", "held"), [
    ({"cache": "device", "spec": "eagle", "page_size": 32}, "the rule's hit"),
    ({"cache": "device", "kv_capacity": "tight", "page_size": 32}, "nothing"),
])
def test_cached_tokens_holds_a_vllm_cell_to_its_rule_and_fails_a_hit_above_it(levels: dict, held: str) -> None:
    """The cached_tokens oracle under each vLLM rule: a warm pass that hits what the rule allows passes (with EAGLE
    one block under the paged rule; under pressure anything down to nothing), and one that hits a block more than
    the rule allows (the paged hit with EAGLE, a block past the ceiling under pressure) fails, naming the rule."""
    traits, workload = vllm_traits(LEVELS.full(levels)), load_workload("system_prompt")
    allowed = traits.cache.rule.expected(workload, traits, "warm", {})
    paged = SHARED.expected(workload, traits, "warm", {})

    def judged(cached: dict[str, int]):
        outputs = [output(r.rid, [1] * r.max_new_tokens, cached=cached[r.rid]) for r in workload.requests]
        return ORACLES["cached_tokens"]([view(outputs, expected_cached=allowed, page_size=32)])

    fits = {rid: e.hi if held == "the rule's hit" else 0 for rid, e in allowed.items()}
    assert judged(fits).status == "pass"
    above = {rid: e.hi + (32 if held == "nothing" else 0) for rid, e in paged.items()}
    verdict = judged(above)
    assert verdict.status == "fail", verdict.message
    assert {f["request"] for f in verdict.detail} and all(traits.cache.rule.name in f["rule"] for f in verdict.detail)


# -- a NIXL pair on a Mamba hybrid: the client sees the prefill side's hit, on prompts one token short -------------
#: issue 44's cell (hybrid × NIXL, system_prompt, page 32 asked, 64 applied: vLLM raises the hybrid's block to hold a
#: Mamba state's page). sys-2 has 65 prompt tokens: 64 on the prefill side, which can hit none of them.
HYBRID_PD = {"model": "hybrid", "pd": "nixl", "cache": "device", "page_size": 64, "prefill_budget": 32}


def test_a_hybrid_nixl_pairs_client_expects_the_prefill_sides_hit_on_prompts_one_token_short() -> None:
    """vLLM's NIXL prefill side drops a Mamba hybrid's last prompt token before its prefix-cache lookup
    (``_truncate_request_for_prefill``, from ``on_new_request``), and that lookup leaves one token to compute
    (``get_computed_blocks``: ``request.num_tokens - 1``): a 65-token prompt whose 64-token block is cached hits
    nothing there, while the decode side, which looks the whole prompt up, hits the block."""
    from harness.sut.vllm_common.cache import PrefillSideShort

    traits = vllm_traits(LEVELS.full(HYBRID_PD))
    rule = traits.cache.rule
    assert isinstance(rule, PrefillSideShort) and rule.backoff == 1 and rule.decode_side is SHARED
    workload = load_workload("system_prompt")
    lengths = {r.rid: len(r.prompt) for r in workload.requests}
    assert lengths["sys-2"] == 65 and lengths["sys-3"] == 70
    client = {rid: (e.lo, e.hi) for rid, e in rule.expected(workload, traits, "warm", {}).items()}
    decode = {rid: (e.lo, e.hi) for rid, e in rule.decode_side.expected(workload, traits, "warm", {}).items()}
    assert client == {"sys-0": (0, 0), "sys-1": (0, 0), "sys-2": (0, 0), "sys-3": (64, 64), "sys-4": (0, 0),
                      "sys-5": (0, 0)}
    assert decode == {**client, "sys-2": (64, 64)}
    assert all("_truncate_request_for_prefill" in e.basis for e in rule.expected(workload, traits, "cold", {}).values())


def test_the_hybrid_nixl_cells_warm_pass_as_measured_meets_the_clients_rule() -> None:
    """The cell's warm pass as vLLM served it (the client saw 64 for sys-3 alone, the prefill side's hits) passes
    cached_tokens; the paged rule on whole prompts, which it was judged by before, expected 64 for sys-2 too."""
    traits, workload = vllm_traits(LEVELS.full(HYBRID_PD)), load_workload("system_prompt")
    measured = {r.rid: 64 if r.rid == "sys-3" else 0 for r in workload.requests}
    outputs = [output(r.rid, [1] * r.max_new_tokens, cached=measured[r.rid]) for r in workload.requests]

    def judged(rule):
        allowed = rule.expected(workload, traits, "warm", {})
        return ORACLES["cached_tokens"]([view(outputs, expected_cached=allowed, page_size=64)])

    assert judged(traits.cache.rule).status == "pass"
    before = judged(SHARED)
    assert before.status == "fail" and [(f["request"], f["expected"]) for f in before.detail] == [("sys-2", "64")]


def test_only_a_hybrid_over_nixl_is_judged_on_shortened_prompts() -> None:
    from harness.sut.vllm_common.cache import PrefillSideShort

    assert vllm_traits(LEVELS.full({**HYBRID_PD, "model": "dense"})).cache.rule is None
    assert vllm_traits(LEVELS.full({**HYBRID_PD, "pd": "off"})).cache.rule is None
    pressed = vllm_traits(LEVELS.full({**HYBRID_PD, "kv_capacity": "tight"})).cache.rule
    assert isinstance(pressed, PrefillSideShort) and isinstance(pressed.inner, EvictedUnderPressure)
