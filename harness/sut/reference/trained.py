"""Trained models the reference engine computes (``MADE_MODEL_LEVELS``): a ``ModelConfig`` read from the Llama
checkpoint the harness makes for the real engines (``harness.models.checkpoints``), whose weights replace the seeded
ones. A level names one by import path (``harness.sut.reference.trained:SMOLLM2``); the checkpoint is built on first
use, not when this module is imported (PEP 562 ``__getattr__``)."""
from __future__ import annotations

import json
from functools import cache

from reference_impl.config import ModelConfig

#: attribute → the checkpoint it reads
CHECKPOINTS = {"SMOLLM2": "smollm2"}


def reference_config(checkpoint: str) -> ModelConfig:
    """The reference model of a Llama ``checkpoint`` (config.json's shape, model.safetensors' weights)."""
    from harness.models.checkpoints import checkpoint_dir

    directory = checkpoint_dir(checkpoint)
    config = json.loads((directory / "config.json").read_text())
    if config.get("architectures") != ["LlamaForCausalLM"] or config.get("rope_scaling"):
        raise ValueError(f"checkpoint {checkpoint!r}: the reference computes an unscaled-RoPE LlamaForCausalLM only")
    heads = int(config["num_attention_heads"])
    return ModelConfig(name=checkpoint, layer_types=("attention",) * int(config["num_hidden_layers"]),
                       vocab_size=int(config["vocab_size"]), hidden=int(config["hidden_size"]), num_heads=heads,
                       num_kv_heads=int(config["num_key_value_heads"]),
                       head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
                       ffn=int(config["intermediate_size"]), rope_theta=float(config["rope_theta"]),
                       rms_eps=float(config["rms_norm_eps"]), weights=str(directory / "model.safetensors"),
                       stop_tokens=() if config.get("eos_token_id") is None else (int(config["eos_token_id"]),))


@cache
def __getattr__(name: str) -> ModelConfig:
    if name not in CHECKPOINTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return reference_config(CHECKPOINTS[name])
