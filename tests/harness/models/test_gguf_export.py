"""The GGUF export of the dense and draft checkpoints (harness/models/gguf_export.py): what llama.cpp reads back.

Metadata and tensors read back with ``gguf.GGUFReader`` must match the checkpoint's config.json and
safetensors, q/k rows permuted to llama.cpp's adjacent-pair RoPE. The test marked ``llamacpp`` serves the
dense GGUF with the real llama-server (``make llama-server``) and checks its greedy tokens against the
reference engine's; it skips without the binary, except under CI=true, where a missing one fails.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fixtures.workloads import Workload, load_workload
from harness.models.checkpoints import checkpoint_dir
from harness.models.gguf_export import GGUF_CHECKPOINTS, gguf_file
from harness.models.gguf_weights import rope_permute
from harness.sut.reference.engine import build_engine_config
from harness.sut.openai.launch import HOST, free_port, llama_server_path
from harness.sut.openai.server import ServerProcess
from harness.sut.openai.wire import llamacpp_body
from reference_impl.config import DENSE32
from reference_impl.engine.llm_engine import Engine
from reference_impl.model.tiny_lm import apply_rope
from reference_impl.request import RequestOutput, RequestSpec
from tests.binaries import required_path


def field(reader: gguf.GGUFReader, key: str) -> object:
    """The value of metadata ``key``, failing with the key's name when the file lacks it."""
    found = reader.get_field(key)
    assert found is not None, f"the GGUF has no metadata key {key!r}"
    return found.contents()


@pytest.mark.parametrize("name", GGUF_CHECKPOINTS)
def test_the_metadata_reads_back_as_the_checkpoints_config(name: str) -> None:
    config = json.loads((checkpoint_dir(name) / "config.json").read_text())
    reader = gguf.GGUFReader(gguf_file(name))
    expected = {
        "general.architecture": "llama",
        "general.file_type": int(gguf.LlamaFileType.ALL_F32),
        "llama.context_length": config["max_position_embeddings"],
        "llama.embedding_length": config["hidden_size"],
        "llama.block_count": config["num_hidden_layers"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": config["num_attention_heads"],
        "llama.attention.head_count_kv": config["num_key_value_heads"],
        "llama.attention.key_length": config["head_dim"],
        "llama.attention.value_length": config["head_dim"],
        "llama.rope.dimension_count": config["head_dim"],
        "llama.rope.freq_base": config["rope_theta"],
        "llama.attention.layer_norm_rms_epsilon": pytest.approx(config["rms_norm_eps"]),
        "llama.vocab_size": config["vocab_size"],
        "tokenizer.ggml.model": "test",
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
    }
    assert {key: field(reader, key) for key in expected} == expected
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert len(set(tokens)) == len(tokens) == config["vocab_size"]
    assert set(types) == {int(gguf.TokenType.NORMAL)}
    special = [key for key in reader.fields if key.startswith("tokenizer.ggml.") and key.endswith("_token_id")]
    assert special == [], f"a special token would be added to prompts or stop generation: {special}"


@pytest.mark.parametrize("name", GGUF_CHECKPOINTS)
def test_every_tensor_reads_back_as_the_checkpoints_bar_the_q_k_permutation(name: str) -> None:
    hf = load_file(checkpoint_dir(name) / "model.safetensors")
    config = json.loads((checkpoint_dir(name) / "config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    read = {t.name: t for t in gguf.GGUFReader(gguf_file(name)).tensors}
    assert len(read) == len(hf)
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for hf_name, weight in hf.items():
        tensor = read[names.get_name(hf_name, try_suffixes=(".weight",))]
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, hf_name
        assert tuple(tensor.shape) == tuple(reversed(weight.shape)), f"{hf_name}: ggml's ne is the shape reversed"
        data = torch.from_numpy(np.array(tensor.data)).reshape(weight.shape)
        proj = hf_name.split(".")[-2]
        if proj in heads:
            data = unpermute(data, heads[proj])
        assert torch.equal(data, weight), f"{hf_name} differs in the GGUF"


def unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """The export's permutation undone, written independently: each head's adjacent pairs back into two halves."""
    d = weight.shape[0] // heads
    return weight.reshape(heads, d // 2, 2, -1).transpose(1, 2).reshape(weight.shape)


def adjacent_pair_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's ``llama`` RoPE (rope type NORM): rotate pairs (2i, 2i + 1) of x: (T, heads, head_dim)."""
    half = x.shape[-1] // 2
    angles = positions.to(torch.float32)[:, None] * theta ** (-torch.arange(half, dtype=torch.float32) / half)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def test_the_permutation_turns_the_references_rope_into_llama_cpps() -> None:
    """Rotate-half RoPE of q = W x equals llama.cpp's adjacent-pair RoPE of (P W) x, with P undone on the output."""
    gen = torch.Generator().manual_seed(0)
    heads, head_dim, hidden = DENSE32.num_heads, DENSE32.head_dim, DENSE32.hidden
    weight, x = torch.randn(heads * head_dim, hidden, generator=gen), torch.randn(5, hidden, generator=gen)
    positions = torch.arange(3, 8)
    reference = apply_rope((x @ weight.T).view(5, heads, head_dim), positions, DENSE32.rope_theta)
    llama_cpp = adjacent_pair_rope((x @ rope_permute(weight, heads).T).view(5, heads, head_dim), positions,
                                   DENSE32.rope_theta)
    halves = llama_cpp.unflatten(-1, (head_dim // 2, 2)).transpose(-1, -2).flatten(-2)  # each head back to HF order
    assert torch.allclose(halves, reference, atol=1e-5)
    assert torch.equal(unpermute(rope_permute(weight, heads), heads), weight)


def test_the_gguf_is_built_once_and_only_for_llama_checkpoints() -> None:
    path = gguf_file("dense")
    assert gguf_file("dense") == path and path.parent == checkpoint_dir("dense")
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".model-")], "a staging file was left"
    with pytest.raises(KeyError, match="'hybrid'"):
        gguf_file("hybrid")


# --- the real llama-server ----------------------------------------------------------------------------------

@contextmanager
def llama_server_on(model: Path, log: Path, *args: str) -> Iterator[ServerProcess]:
    """llama-server on 127.0.0.1 serving ``model``, healthy, in its own process group, stopped however the test ends."""
    port = free_port()
    argv = [str(required_path(llama_server_path(), "llama-server")), "-m", str(model), "--host", HOST, "--port", str(port), "-t", "1", *args]
    server = ServerProcess(argv, {}, port, log)
    try:
        server.wait_healthy("/health", 60)
        yield server
    finally:
        server.stop()


def complete(server: ServerProcess, spec: RequestSpec) -> dict:
    """Greedy, exactly ``max_new_tokens`` tokens after the token-id prompt, with raw top-2 logprobs per step."""
    return server.call("/completion", {**llamacpp_body(spec, 2, ""), "cache_prompt": False}, 60, f"to {spec.rid}")


def agreement_specs() -> list[RequestSpec]:
    """Three prompts: two golden-workload requests (a shared system prompt, a multi-turn one) and a short random one."""
    gen = torch.Generator().manual_seed(7)
    short = tuple(torch.randint(0, DENSE32.vocab_size, (9,), generator=gen).tolist())
    golden = [load_workload("system_prompt").requests[0], load_workload("multi_turn").requests[2]]
    return [replace(spec, max_new_tokens=16) for spec in golden] + [RequestSpec("short", short, 16)]


def reference_outputs(specs: list[RequestSpec]) -> dict[str, RequestOutput]:
    """The reference engine's greedy outputs for ``specs`` on DENSE32, the dense checkpoint's function."""
    workload = Workload("llamacpp", "the llama-server agreement prompts", tuple(specs))
    engine = Engine(build_engine_config({"model": "reference_impl.config:DENSE32"}, workload, frozenset()))
    return {out.rid: out for out in engine.generate(specs)}


@pytest.mark.llamacpp
@pytest.mark.xdist_group("llamacpp")  # make test's --dist loadgroup: one llama-server at a time
def test_llama_servers_greedy_tokens_on_the_dense_gguf_equal_the_reference_engines(tmp_path: Path) -> None:
    """F32 weights and KV, no flash attention, one slot: the same tokens, raw logprobs within float rounding."""
    specs = agreement_specs()
    reference = reference_outputs(specs)
    args = ("-c", "512", "-np", "1", "-fa", "off", "-ctk", "f32", "-ctv", "f32")
    with llama_server_on(gguf_file("dense"), tmp_path / "llama-server.log", *args) as server:
        for spec in specs:
            got, ref = complete(server, spec), reference[spec.rid]
            assert got["tokens_evaluated"] == len(spec.prompt), f"{spec.rid}: llama-server added tokens to the prompt"
            step = next((i for i, (a, b) in enumerate(zip(got["tokens"], ref.tokens)) if a != b), 0)
            assert got["tokens"] == ref.tokens, (f"{spec.rid}: llama-server {got['tokens']} != reference {ref.tokens}, "
                                                 f"first at step {step} (reference margin {ref.margins[step]:.3g})")
            logprobs = [p["logprob"] for p in got["completion_probabilities"]]
            assert logprobs == pytest.approx(ref.logprobs, abs=1e-4), spec.rid
            top2 = [[t["id"] for t in p["top_logprobs"]] for p in got["completion_probabilities"]]
            assert top2 == [ids[:2] for ids in ref.top_ids], spec.rid


@pytest.mark.llamacpp
@pytest.mark.xdist_group("llamacpp")  # make test's --dist loadgroup: one llama-server at a time
def test_the_draft_gguf_drafts_for_llama_server_without_changing_its_tokens(tmp_path: Path) -> None:
    """spec = draft on llama.cpp: the one-layer draft's proposals are sometimes accepted; the tokens stay the target's.

    llama-server returns no probabilities for tokens decoded through speculation, so only tokens are compared.
    """
    specs = agreement_specs()
    reference = reference_outputs(specs)
    args = ("-c", "512", "-np", "1", "-fa", "off", "-ctk", "f32", "-ctv", "f32", "-md", str(gguf_file("draft")),
            "--spec-type", "draft-simple", "--spec-draft-n-max", "3")
    with llama_server_on(gguf_file("dense"), tmp_path / "llama-server.log", *args) as server:
        answers = {spec.rid: complete(server, spec) for spec in specs}
    assert {rid: got["tokens"] for rid, got in answers.items()} == {rid: out.tokens for rid, out in reference.items()}
    drafted = sum(got["timings"].get("draft_n", 0) for got in answers.values())
    accepted = sum(got["timings"].get("draft_n_accepted", 0) for got in answers.values())
    assert 0 < accepted < drafted, f"the one-layer draft should be right sometimes, not always: {accepted}/{drafted}"
