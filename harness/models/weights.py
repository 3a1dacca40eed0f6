"""Checkpoint weights drawn from a seed with torch and safetensors alone (no kvmatrix import), so that a reproducer
script carries these very definitions (vLLM's and llama.cpp's script writers copy them in) and serves the weights the
cell served. The hybrid model's recipe is this module's own (``harness.models.checkpoints`` builds from it); the dense
one mirrors ``harness.models.checkpoints.dense_tensors``, which exports the reference model's, and a test holds the two
equal tensor by tensor."""
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


def eagle_head(dense: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """An EAGLE-1 head in vLLM's EagleLlamaForCausalLM layout made of a dense Llama's own tensors: ``fc`` passes the
    embedding and drops the hidden state, layer 0 has the shapes of the dense model's and every weight zero (its
    input norm left out: vLLM replaces it by the identity), then the dense model's layers; no embedding and no LM
    head (vLLM shares the target's). ``harness.models.checkpoints.eagle_tensors`` says why it drafts the target's
    tokens one position behind."""
    out = {"fc.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)}
    for name, t in dense.items():
        if name.startswith("model.layers.0."):
            out[name.replace("model.layers.0.", "layers.0.")] = (torch.ones_like(t) if name.endswith("layernorm.weight")
                                                                 else torch.zeros_like(t))
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            out[f"layers.{int(index) + 1}.{rest}"] = t
    out.pop("layers.0.input_layernorm.weight")
    return out


def mamba2_layer(gen: torch.Generator, prefix: str, c: dict) -> dict[str, torch.Tensor]:
    """A Mamba2 mixer under HF names; A and Δ drawn as Mamba2's own init (A in [1, 16], Δ in [1e-3, 0.1])."""
    h, nheads, d_state = c["hidden_size"], c["mamba_n_heads"], c["mamba_d_state"]
    d_inner = c["mamba_expand"] * h
    conv_dim = d_inner + 2 * c["mamba_n_groups"] * d_state
    dt = torch.exp(torch.rand(nheads, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return {
        prefix + "in_proj.weight": scaled_randn(gen, 2 * d_inner + 2 * c["mamba_n_groups"] * d_state + nheads, h),
        prefix + "conv1d.weight": scaled_randn(gen, conv_dim, 1, c["mamba_d_conv"]),
        prefix + "conv1d.bias": torch.zeros(conv_dim),
        prefix + "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus(dt_bias) = dt
        prefix + "A_log": torch.log(1 + 15 * torch.rand(nheads, generator=gen)),
        prefix + "D": torch.ones(nheads),
        prefix + "norm.weight": torch.ones(d_inner),
        prefix + "out_proj.weight": scaled_randn(gen, h, d_inner),
    }


def hybrid_tensors(c: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights for the hybrid GraniteMoeHybrid config ``c`` under HF names: attention and Mamba2
    layers, each with a dense shared SwiGLU MLP."""
    gen = torch.Generator().manual_seed(seed)
    h, ffn = c["hidden_size"], c["shared_intermediate_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    out = {
        "model.embed_tokens.weight": torch.randn(c["vocab_size"], h, generator=gen),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": scaled_randn(gen, c["vocab_size"], h, gain=4.0),  # sharper logits: fewer near-ties
    }
    for i, kind in enumerate(c["layer_types"]):
        prefix = f"model.layers.{i}."
        out |= {
            prefix + "input_layernorm.weight": torch.ones(h),
            prefix + "post_attention_layernorm.weight": torch.ones(h),
            prefix + "shared_mlp.input_linear.weight": scaled_randn(gen, 2 * ffn, h),  # gate and up, stacked
            prefix + "shared_mlp.output_linear.weight": scaled_randn(gen, h, ffn),
        }
        if kind == "attention":
            out |= {prefix + f"self_attn.{name}.weight": scaled_randn(gen, rows, h)
                    for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv), ("o_proj", h))}
        else:
            out |= mamba2_layer(gen, prefix + "mamba.", c)
    return out


def write_checkpoint(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    """``config.json`` and ``model.safetensors`` in ``directory``: what an engine loads as a model path."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    return str(path)
