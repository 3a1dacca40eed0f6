"""The dense checkpoint the real engines serve, rebuilt from its recipe inline: seeded, no hub, no kvmatrix import
(torch and safetensors alone). A vLLM or llama.cpp reproducer carries these definitions, so the weights it serves are
the very ones the cell served: ``harness.sut.checkpoints.dense_tensors`` exports the reference model's, and a test
holds the two equal tensor by tensor. (The hybrid checkpoint's recipe, ``hybrid_tensors`` there, is plain torch
already: a script copies it as it is.)"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def scaled_randn(gen: torch.Generator, *shape: int, gain: float = 1.0) -> torch.Tensor:
    """Gaussian weights scaled by 1/sqrt(fan_in), drawn from ``gen``."""
    return torch.randn(shape, generator=gen) * gain / math.sqrt(shape[-1])


def dense_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """The reference model's weights for an all-attention Llama ``config`` (config.json's keys) under HF names, drawn
    in the reference's order: the embedding; per layer q, k, v, o, then gate, up, down; the LM head as the embedding
    permuted to a seeded successor plus half as much noise."""
    h, vocab, d = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads, ffn = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab, h, generator=gen)
    out = {"model.embed_tokens.weight": embed}
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for name, rows, cols in (("self_attn.q_proj", heads * d, h), ("self_attn.k_proj", kv_heads * d, h),
                                 ("self_attn.v_proj", kv_heads * d, h), ("self_attn.o_proj", h, heads * d),
                                 ("mlp.gate_proj", ffn, h), ("mlp.up_proj", ffn, h), ("mlp.down_proj", h, ffn)):
            out[f"{prefix}{name}.weight"] = scaled_randn(gen, rows, cols)
        out[prefix + "input_layernorm.weight"] = torch.ones(h)
        out[prefix + "post_attention_layernorm.weight"] = torch.ones(h)
    successor = torch.randperm(vocab, generator=gen)
    head = torch.empty_like(embed)
    head[successor] = embed.clone()
    noise = torch.randn(vocab, h, generator=gen)
    out["lm_head.weight"] = (head + 0.5 * noise) / math.sqrt(h)
    out["model.norm.weight"] = torch.ones(h)
    return out


def write_checkpoint(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    """``config.json`` and ``model.safetensors`` in ``directory``: what an engine loads as a model path."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    return str(path)
