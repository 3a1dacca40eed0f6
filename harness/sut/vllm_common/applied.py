"""What vLLM applied of what it was asked, read back after start, and the traits a cell is judged by once it is:
the same for the offline engine (its child's ``applied_config``) and the api_server (``/server_info``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from harness.sut.base import Applied, Traits
from harness.sut.vllm_common.cache import cache_rule
from harness.sut.vllm_common.spec import drops_eagle_block, replays_hits


#: what is read back after start: (our factor, the ``vllm.LLM`` argument, the read-back key, why a change defeats the
#: cell, "" when it does not: a block size vLLM raised is judged as applied, ``read_back`` adopts it).
READ_BACK = (
    ("page_size", "block_size", "block_size", ""),
    ("async_scheduling", "async_scheduling", "async_scheduling",
     "the cell tests async scheduling and vLLM ran the plain scheduler (vllm/platforms/cpu.py, "
     "check_and_update_config: 'async scheduling is not required on CPU')"),
    ("kv_cache_dtype", "kv_cache_dtype", "kv_cache_dtype", "the cell tests a KV cache dtype vLLM did not use"),
    ("cache", "enable_prefix_caching", "enable_prefix_caching", "the cell tests prefix caching and vLLM turned it off"),
    ("max_num_seqs", "max_num_seqs", "max_num_seqs", ""),
    ("prefill_budget", "max_num_batched_tokens", "max_num_batched_tokens", ""),
    ("kv_capacity", "num_gpu_blocks_override", "num_gpu_blocks",
     "the cell presses KV memory and vLLM allocated other than the blocks asked"),
)


def read_back(arguments: Mapping[str, object], applied: Mapping[str, object]) -> tuple[Applied, ...]:
    """What vLLM applied of ``arguments`` (the child's ``applied_config``), setting by setting; a setting the
    arguments leave to vLLM, or the child does not report, is not compared; a proposer vLLM dropped or resized
    defeats a spec cell."""
    found = [Applied(factor, arguments[argument], applied.get(key), defeats)
             for factor, argument, key, defeats in READ_BACK if argument in arguments and key in applied]
    spec = arguments.get("speculative_config")
    if isinstance(spec, Mapping) and "spec_method" in applied:
        asked, used = (spec["method"], spec["num_speculative_tokens"]), (applied.get("spec_method"),
                                                                         applied.get("num_speculative_tokens"))
        found.append(Applied("spec", asked, used, "the cell tests this proposer and vLLM ran another"))
    if isinstance(spec, Mapping) and "drops_eagle_block" in applied:
        found.append(Applied("eagle_block_drop", drops_eagle_block(spec), applied["drops_eagle_block"],
                             "the cell tests vLLM's prefix cache with the EAGLE block drop as asked, and vLLM did "
                             "the other"))
    return tuple(found)


def applied_traits(traits: Traits, applied: tuple[Applied, ...], levels: Mapping[str, object]) -> Traits:
    """``traits`` with what vLLM applied read back: its cache judged by the block size it used (vLLM raises a hybrid
    model's attention block to hold a Mamba state's page: ``vllm/model_executor/models/config.py``) and by the EAGLE
    block drop it applied (``levels``: the cell's, for the rest of its cache rule)."""
    used = {setting.what: setting.used for setting in applied}
    page = used.get("page_size", traits.cache.page_size)
    page = page if isinstance(page, int) else traits.cache.page_size
    drops = used.get("eagle_block_drop")
    if not isinstance(drops, bool):
        drops = None
    rule = traits.cache.rule if drops is None else cache_rule(levels, drops)
    cache = replace(traits.cache, page_size=page, chunk_size=page, state_interval=page, rule=rule)
    spec = traits.spec if drops is None else replace(traits.spec, replay_hits=replays_hits(traits.spec.method, drops))
    return replace(traits, cache=cache, spec=spec, applied=applied)
