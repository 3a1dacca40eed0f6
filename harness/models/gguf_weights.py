"""An HF Llama checkpoint's tensors written as a llama.cpp GGUF, with gguf and torch alone (no kvmatrix import), so
that a llama.cpp reproducer script carries these very definitions and serves the file the cell served.

Two things differ from the Hugging Face layout:

- llama.cpp's ``llama`` rotates adjacent pairs (2i, 2i + 1) where HF Llama rotates (i, i + head_dim / 2), so
  q_proj and k_proj rows are permuted per head, exactly as convert_hf_to_gguf.py's ``LlamaModel.permute``.
- The model has no tokenizer (prompts are token ids), so the GGUF carries llama.cpp's synthetic ``test``
  vocabulary: one normal token per id, no BOS, EOS or other special token. With no end-of-generation token,
  ``ignore_eos`` biases no logit and nothing stops a request before ``n_predict``.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import torch

#: llama.cpp's synthetic vocabulary: tokens have no text and no special ids unless the file names them
TOKENIZER_MODEL = "test"


def write_gguf(path: Path, config: dict, tensors: dict[str, torch.Tensor], *, name: str) -> None:
    """Write the HF Llama checkpoint (``config``, ``tensors``) to ``path`` as a llama.cpp GGUF."""
    if config["architectures"] != ["LlamaForCausalLM"] or config.get("rope_scaling"):
        raise ValueError(f"checkpoint {name!r}: GGUF export takes a plain LlamaForCausalLM, got "
                         f"{config['architectures']} with rope_scaling {config.get('rope_scaling')}")
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    add_hyperparameters(writer, config, name)
    add_token_id_vocab(writer, config["vocab_size"])
    for gguf_name, tensor in gguf_tensors(config, tensors).items():
        writer.add_tensor(gguf_name, tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_hyperparameters(writer: gguf.GGUFWriter, config: dict, name: str) -> None:
    """The ``llama.*`` keys llama.cpp reads; head_dim is explicit, since heads * head_dim != hidden_size here."""
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])


def add_token_id_vocab(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """A vocabulary of ``vocab_size`` normal tokens and no special ones, which adds nothing to a token-id prompt."""
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_token_list([f"<t{i}>" for i in range(vocab_size)])  # llama.cpp wants distinct texts
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab_size)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def gguf_tensors(config: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` under llama.cpp's names, q_proj and k_proj permuted to its adjacent-pair RoPE; F32, contiguous.

    The LM head is untied, so lm_head becomes output.weight (llama.cpp reuses token_embd only when it is absent).
    """
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out = {}
    for hf_name, tensor in tensors.items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight",))
        if gguf_name is None:
            raise KeyError(f"GGUF export: no llama.cpp name for tensor {hf_name!r}")
        if hf_name.endswith("self_attn.q_proj.weight"):
            tensor = rope_permute(tensor, heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            tensor = rope_permute(tensor, kv_heads)
        out[gguf_name] = tensor.to(torch.float32).contiguous()
    return out


def rope_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's output rows from rotate-half pairs (i, i + d/2) to adjacent pairs (2i, 2i + 1).

    convert_hf_to_gguf.py's ``LlamaModel.permute``: row i of a head goes to 2i, row i + d/2 to 2i + 1.
    """
    head_half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, head_half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
