"""A trained checkpoint read into the reference model (``ModelConfig.weights``): by the same Llama-name table the
served checkpoints are written with, every tensor accounted for, the head tied to the embedding where it is left out."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from reference_impl.config import DENSE32
from reference_impl.model.load import LM_HEAD, hf_parameters, load_model, read_hf_weights

PROMPT = [3, 17, 42, 99, 5, 250, 8]


def exported(tmp_path: Path, drop: tuple[str, ...] = (), **change: torch.Tensor) -> Path:
    """DENSE32's weights as a Llama checkpoint file, less ``drop``, with ``change`` put in."""
    tensors = {name: t.detach().clone() for name, t in hf_parameters(load_model(DENSE32, "cpu", torch.float32)).items()}
    tensors = {name: t for name, t in {**tensors, **change}.items() if name not in drop}
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path / "model.safetensors"


def test_a_checkpoint_read_back_computes_the_model_it_was_written_from(tmp_path: Path) -> None:
    other = replace(DENSE32, seed=99, weights=str(exported(tmp_path)))  # another seed: every weight must be replaced
    got = load_model(other, "cpu", torch.float32).sequence_logits(PROMPT)
    want = load_model(DENSE32, "cpu", torch.float32).sequence_logits(PROMPT)
    assert torch.equal(got, want)
    seeded = load_model(replace(DENSE32, seed=99), "cpu", torch.float32).sequence_logits(PROMPT)
    assert not torch.equal(seeded, want)


def test_a_tied_checkpoint_without_a_head_reads_the_embedding_as_its_head(tmp_path: Path) -> None:
    model = load_model(replace(DENSE32, seed=99, weights=str(exported(tmp_path, drop=(LM_HEAD,)))), "cpu", torch.float32)
    assert torch.equal(model.lm_head, model.embed)


@pytest.mark.parametrize("drop, change, needle", [
    (("model.layers.3.mlp.up_proj.weight",), {}, "missing \\['model.layers.3.mlp.up_proj.weight'\\]"),
    ((), {"model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}, "extra \\['model.layers.9"),
    ((), {"model.norm.weight": torch.ones(7)}, "model.norm.weight is \\(7,\\), the model's \\(64,\\)"),
])
def test_a_checkpoint_that_is_not_the_models_is_refused_naming_the_tensor(tmp_path: Path, drop: tuple[str, ...],
                                                                          change: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        load_model(replace(DENSE32, seed=98, weights=str(exported(tmp_path, drop, **change))), "cpu", torch.float32)


def test_a_model_tensor_without_a_llama_name_is_refused(tmp_path: Path) -> None:
    """The trained model is built on the meta device (no init): a tensor the checkpoint cannot fill would be garbage."""
    model = load_model(replace(DENSE32, seed=97), "cpu", torch.float32)
    model.register_buffer("scale", torch.ones(1))
    with pytest.raises(ValueError, match="1 tensor\\(s\\) without a Llama name"):
        read_hf_weights(model, exported(tmp_path))
