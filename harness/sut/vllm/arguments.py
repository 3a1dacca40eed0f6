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
                        ``max_model_len`` to match
dtype                   ``dtype`` (float32, bfloat16)
deterministic           ``VLLM_BATCH_INVARIANT=1`` in the child's environment (CUDA only)
model                   a checkpoint made here (dense, hybrid, smollm2) or a path to one
[engine_args]           passed through as they are, last
======================  =====================================================================
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from fixtures.spec_expect import LookupRule, ModelRule, Proposer
from fixtures.workloads import Workload
from harness.sut.base import Applied
from harness.models.checkpoints import DRAFT_LAYERS, MAX_POSITIONS, SERVED_DENSE, checkpoint_dir, draft_of
from harness.sut.vllm.connectors import tier_config

#: the ngram level's prompt lookup, suffix n-grams of 2 to 4 tokens, as vLLM 0.32.0 drafts it.
#: ``v1/spec_decode/ngram_proposer.py`` ``_find_longest_matched_ngram_and_propose_tokens``: the longest suffix n-gram
#: (KMP over the reversed context) that occurred earlier, and of its occurrences the earliest, whose next tokens are the
#: draft, at most ``k`` and ``max_model_len`` less the context. Nothing cuts the draft to the request's ``max_tokens``:
#: the scheduler (``v1/core/sched/scheduler.py`` ``Scheduler.schedule``) caps the scheduled tokens at ``max_model_len``
#: only, and ``Scheduler.update_from_output`` counts the step's accepted tokens before ``_update_request_with_output``
#: cuts the emitted ones at ``max_tokens``. ``max_model_len`` here is the checkpoints' (``MAX_POSITIONS``).
VLLM_LOOKUP = LookupRule("vLLM's rule", min_n=2, max_n=4, earliest=True, within_request=False,
                         max_model_len=MAX_POSITIONS)


#: the proposers whose drafts the reference replays, by spec level: (what drafts, the reference model, its first
#: ``layers`` layers (None: all), the context tokens it skips). vLLM's draft_model proposer runs its draft greedily over
#: the whole context (``v1/spec_decode/draft_model.py``); its EAGLE proposer feeds the head token j + 1 at position j
#: (``v1/spec_decode/eagle.py``, ``propose``), and the head made here is the dense model behind a zero layer
#: (``harness.models.checkpoints.eagle_tensors``): the dense model over the context less its first token.
MODEL_DRAFTS = {
    "draft": ("the draft (the dense model's first layer)", SERVED_DENSE, DRAFT_LAYERS, 0),
    "eagle": ("the EAGLE head (the dense model one token behind)", SERVED_DENSE, None, 1),
    "self": ("the self-draft (the dense model itself)", SERVED_DENSE, None, 0),
}


def whole_drafts(arguments: Mapping[str, object]) -> bool:
    """Whether every verify step carries its request's whole draft. ``Scheduler.schedule`` serves the running requests
    in turn from ``max_num_batched_tokens`` and cuts a request's draft to the tokens left to it
    (``num_scheduled_spec_tokens``), by design, so only ``max_num_seqs`` × (1 + k) within the budget leaves every draft
    whole (a request still prefilling was admitted after those decoding, and is served after them)."""
    spec = arguments.get("speculative_config") or {}
    return not spec or int(arguments["max_num_seqs"]) * (1 + int(spec["num_speculative_tokens"])) <= int(
        arguments["max_num_batched_tokens"])


def replay_rule(levels: Mapping[str, object], arguments: Mapping[str, object]) -> Proposer | None:
    """The rule a cell's proposer drafts by, for accept_length to replay over each request's tokens; None where its
    drafts are not a function of each request's tokens alone, or not one the reference runs: no proposer, a token
    budget that may cut a draft (``whole_drafts``), a self-draft of a model other than the dense one. Model
    proposers draft as n-gram lookup does, k tokens bounded by ``max_model_len`` alone.
    """
    spec = arguments.get("speculative_config") or {}
    if not spec or not whole_drafts(arguments):
        return None
    max_model_len = int(arguments.get("max_model_len", MAX_POSITIONS))
    if spec["method"] == "ngram":
        return replace(VLLM_LOOKUP, min_n=int(spec["prompt_lookup_min"]), max_n=int(spec["prompt_lookup_max"]),
                       max_model_len=max_model_len)
    level = str(levels["spec"])
    if level not in MODEL_DRAFTS or (level == "self" and levels["model"] != "dense") or (
            level == "draft" and draft_of(str(levels["model"])) != "draft"):
        return None  # the reference runs the dense model's drafts only, not a trained model's own
    what, model, layers, skip = MODEL_DRAFTS[level]
    return ModelRule(f"vLLM's {spec['method']} proposer running {what}", model, layers, skip, within_request=False,
                     max_model_len=max_model_len)


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


#: the proposers whose prefix-cache hits vLLM shortens by a block (``SpeculativeConfig.use_eagle``, 0.32.0)
EAGLE_LIKE = ("eagle", "eagle3", "mtp", "dflash", "dspark")


def drops_eagle_block(spec: Mapping[str, object]) -> bool:
    """Whether vLLM drops the last matched block for ``spec`` (a ``speculative_config``), by its rule:
    ``SpeculativeConfig.use_eagle_block_drop``, an EAGLE-like method without ``disable_eagle_block_drop``."""
    return spec.get("method") in EAGLE_LIKE and not spec.get("disable_eagle_block_drop", False)
