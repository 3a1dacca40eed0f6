"""What a vLLM cell's levels become: ``vllm.LLM`` keyword arguments, the matrix's ``[engine_args]`` last.

======================  =====================================================================
cache                   ``enable_prefix_caching`` (off; device; a tier below it, which adds a KV connector:
                        ``connectors.tier_config``)
pd                      off, or a pair of engines, each with a PD connector (``connectors.pd_config``)
page_size               ``block_size``
prefill_budget          ``max_num_batched_tokens`` (chunked prefill is always on in vLLM V1)
max_num_seqs            ``max_num_seqs``
spec, num_draft_tokens  ``speculative_config``: ngram (prompt lookup 2..4), draft (the dense model cut
                        to one layer; smollm2's own first layers: ``checkpoints.draft_of``), eagle (an EAGLE-1
                        head: the dense model one token behind), self (the
                        target's own weights as its draft: every draft token is accepted, accept length
                        exactly k + 1)
eagle_block_drop        on (vLLM's default: an EAGLE head's hit loses its last matched block), off:
                        ``speculative_config.disable_eagle_block_drop`` (with spec = eagle only)
scheduler               ``scheduling_policy`` (the workload's priorities are always passed)
async_scheduling        ``async_scheduling``
kv_cache_dtype          ``kv_cache_dtype`` (auto, fp8)
kv_capacity             roomy: a fixed 256 MiB KV cache; tight: ``num_gpu_blocks_override`` of the blocks the
                        workload's largest request needs plus vLLM's null block (``tight_blocks``), and
                        ``max_model_len`` to match; a PD pair's prefill side holds a whole round
                        (``prefill_blocks``)
dtype                   ``dtype`` (float32, bfloat16)
deterministic           ``VLLM_BATCH_INVARIANT=1`` in the child's environment (CUDA only)
model                   a checkpoint made here (dense, hybrid, smollm2) or a path to one
[engine_args]           passed through as they are, last
======================  =====================================================================
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fixtures.workloads import Workload
from harness.models.checkpoints import checkpoint_dir, draft_of
from harness.sut.vllm.connectors import tier_config
from harness.sut.vllm_common.spec import VLLM_LOOKUP

def speculative_config(levels: Mapping[str, object]) -> dict | None:
    """``speculative_config`` for the cell's ``spec`` level, None without speculative decoding."""
    spec, k = levels["spec"], levels["num_draft_tokens"]
    if spec == "none":
        return None
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": VLLM_LOOKUP.min_n,
                "prompt_lookup_max": VLLM_LOOKUP.max_n}
    if spec == "eagle":  # eagle_block_drop = off: vLLM's SpeculativeConfig.disable_eagle_block_drop (0.32.0, PR #53388)
        drop = {} if levels.get("eagle_block_drop", "on") == "on" else {"disable_eagle_block_drop": True}
        return {"method": "eagle", "model": str(checkpoint_dir("eagle")), "num_speculative_tokens": k, **drop}
    draft = levels["model"] if spec == "self" else draft_of(str(levels["model"]))
    return {"method": "draft_model", "model": str(checkpoint_dir(str(draft))), "num_speculative_tokens": k}


def tight_blocks(workload: Workload, levels: Mapping[str, object]) -> int:
    """The KV blocks of a tight cell: what the workload's largest request needs, its draft tokens' lookahead
    included, one block more, and vLLM's null block (block 0, never handed out: ``vllm/v1/core/block_pool.py``).
    The largest request fits alone; two admitted side by side outgrow the cache as they decode, and vLLM preempts
    (``vllm/v1/core/sched/scheduler.py``, when ``allocate_slots`` finds no free block for a running request). Without
    the spare block requests mostly run one at a time and only bursts preempt (BENCHMARKS.md)."""
    page, lookahead = int(levels["page_size"]), int(levels["num_draft_tokens"]) if levels["spec"] != "none" else 0
    return max(-(-(len(r.prompt) + r.max_new_tokens + lookahead) // page) for r in workload.requests) + 2


def round_size(workload: Workload) -> int:
    """The most requests one round of ``workload`` serves side by side."""
    return max(len(group) for group in workload.rounds())


def prefill_blocks(workload: Workload, levels: Mapping[str, object]) -> int:
    """The KV blocks of a tight PD pair's prefill side: ``tight_blocks`` less the null block for every request of
    the workload's largest round, and the null block. The harness hands a round to the decode side once the prefill
    side has answered all of it, and the prefill side keeps each request's blocks, leased, until the decode side has
    read them: sized as the decode side, it holds one or two requests of a round and the rest wait for a lease to
    run out (NixlConnector's ``kv_lease_duration``, 30 s), after which the decode side reads blocks handed out again
    (``findings/vllm-pd-expired-lease-read``). So the pressure a tight pair puts on is the decode side's."""
    return round_size(workload) * (tight_blocks(workload, levels) - 1) + 1


def prefill_arguments(workload: Workload, levels: Mapping[str, object]) -> dict:
    """What a PD pair's prefill side gets over the cell's arguments: a tight cell's ``prefill_blocks``, else nothing."""
    return {"num_gpu_blocks_override": prefill_blocks(workload, levels)} if levels["kv_capacity"] == "tight" else {}


def engine_arguments(levels: Mapping[str, object], engine_args: Mapping[str, object],
                     tier_dir: Path | None = None, blocks: int | None = None) -> dict:
    """``vllm.LLM`` keyword arguments for a cell's full levels, ``[engine_args]`` last; ``tier_dir`` is the directory
    of a storage tier (``cache = storage``), ``blocks`` the KV blocks of a tight cell (``tight_blocks``). A PD pair
    adds each engine's own ``kv_transfer_config``."""
    args = {
        "model": str(checkpoint_dir(str(levels["model"]))),
        "enable_prefix_caching": levels["cache"] != "off",
        "block_size": levels["page_size"],
        "max_num_batched_tokens": levels["prefill_budget"],
        "max_num_seqs": levels["max_num_seqs"],
        "scheduling_policy": levels["scheduler"],
        "async_scheduling": levels["async_scheduling"] == "on",
        "kv_cache_dtype": levels["kv_cache_dtype"],
        "dtype": levels["dtype"],
        "seed": 0,
    }
    spec = speculative_config(levels)
    if spec is not None:
        args["speculative_config"] = spec
    tier = tier_config(str(levels["cache"]), tier_dir)
    if tier is not None:
        args["kv_transfer_config"] = tier
    if blocks is not None:  # what the usable blocks hold (vLLM refuses to start with a longer max_model_len)
        args.update(num_gpu_blocks_override=blocks, max_model_len=(blocks - 1) * int(levels["page_size"]))
    return {**args, **engine_args}
