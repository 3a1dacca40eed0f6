"""The reference model as an engine loads it (``load_model``): seeded, or a trained checkpoint's weights read under
their Hugging Face Llama names, the one table a served checkpoint is also made by (``harness.models.checkpoints``)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from reference_impl.config import ModelConfig
from reference_impl.model.tiny_lm import TinyLM

#: the checkpoint's head, absent where the model ties it to the embedding (``tie_word_embeddings``)
LM_HEAD = "lm_head.weight"


def hf_parameters(model: TinyLM) -> dict[str, torch.Tensor]:
    """Every weight of an all-attention ``model`` by its Llama name (each linear is ``x @ W.T``, as nn.Linear)."""
    if model.cfg.is_hybrid:
        raise ValueError(f"model {model.cfg.name!r} has Mamba2 layers; only all-attention models map to Llama")
    out = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.final_norm, LM_HEAD: model.lm_head}
    for i, (block, mlp) in enumerate(zip(model.blocks, model.mlps)):
        prefix, attn = f"model.layers.{i}.", block.mixer
        out |= {prefix + "input_layernorm.weight": block.norm1, prefix + "post_attention_layernorm.weight": block.norm2,
                prefix + "self_attn.q_proj.weight": attn.wq, prefix + "self_attn.k_proj.weight": attn.wk,
                prefix + "self_attn.v_proj.weight": attn.wv, prefix + "self_attn.o_proj.weight": attn.wo,
                prefix + "mlp.gate_proj.weight": mlp.w_gate, prefix + "mlp.up_proj.weight": mlp.w_up,
                prefix + "mlp.down_proj.weight": mlp.w_down}
    return out


@torch.no_grad()
def read_hf_weights(model: TinyLM, path: str | Path) -> None:
    """Replace ``model``'s seeded weights by a Llama checkpoint's (one safetensors file): every name must be there
    with its shape (the head may be left out: then it is the embedding, tied); nothing in the file may be left over."""
    from safetensors.torch import load_file  # only a trained model needs it (the GPU machine's python lacks it)

    tensors = load_file(str(path))
    wanted = hf_parameters(model)
    unnamed = {id(t) for t in [*model.parameters(), *model.buffers()]} - {id(t) for t in wanted.values()}
    if unnamed:  # a tensor no Llama name covers would keep its init (or, built on the meta device, no values at all)
        raise ValueError(f"model {model.cfg.name!r} has {len(unnamed)} tensor(s) without a Llama name")
    if LM_HEAD not in tensors:
        tensors[LM_HEAD] = tensors.get("model.embed_tokens.weight")
    missing = sorted(name for name in wanted if tensors.get(name) is None)
    extra = sorted(set(tensors) - set(wanted))
    if missing or extra:
        raise ValueError(f"{path}: not {model.cfg.name!r}'s Llama weights (missing {missing[:3]}, extra {extra[:3]})")
    for name, param in wanted.items():
        if tensors[name].shape != param.shape:
            raise ValueError(f"{path}: {name} is {tuple(tensors[name].shape)}, the model's {tuple(param.shape)}")
        param.copy_(tensors[name].to(param.dtype))


@lru_cache(maxsize=8)
def load_model(cfg: ModelConfig, device: str, dtype: torch.dtype) -> TinyLM:
    """The model for ``cfg``: seeded, or a trained checkpoint's weights (``cfg.weights``); weights are read-only, so
    engines share one instance."""
    if cfg.weights is None:
        return TinyLM(cfg, device=device, dtype=dtype)
    with torch.device("meta"):  # shapes only: the seeded init would be overwritten by the checkpoint's every weight
        model = TinyLM(cfg, device="meta", dtype=dtype)
    model.to_empty(device=device)
    read_hf_weights(model, cfg.weights)
    return model
