"""How vLLM's proposers draft, as accept_length replays them, and which of them shorten a prefix-cache hit: read from
vLLM 0.32.0's ``v1/spec_decode/`` and ``SpeculativeConfig``."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from fixtures.spec_expect import LookupRule, ModelRule, Proposer
from harness.models.checkpoints import DRAFT_LAYERS, MAX_POSITIONS, SERVED_DENSE, draft_of

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


#: the proposers whose prefix-cache hits vLLM shortens by a block (``SpeculativeConfig.use_eagle``, 0.32.0)
EAGLE_LIKE = ("eagle", "eagle3", "mtp", "dflash", "dspark")


def drops_eagle_block(spec: Mapping[str, object]) -> bool:
    """Whether vLLM drops the last matched block for ``spec`` (a ``speculative_config``), by its rule:
    ``SpeculativeConfig.use_eagle_block_drop``, an EAGLE-like method without ``disable_eagle_block_drop``."""
    return spec.get("method") in EAGLE_LIKE and not spec.get("disable_eagle_block_drop", False)


def replays_hits(spec: str, drops_eagle_block: bool) -> bool:
    """Whether a pass with prefix-cache hits can be replayed. Not where vLLM keeps an EAGLE head's last matched block
    (``disable_eagle_block_drop``): the head reads token j + 1 at position j, so its KV at a block's last position
    was written with the token after the block in the request that filled it, and another request's drafts over it
    are not the request's own. That is why vLLM drops the block (PR #17137); the option is there "for measuring the
    acceptance-rate impact" (``SpeculativeConfig.disable_eagle_block_drop``)."""
    return spec != "eagle" or drops_eagle_block
