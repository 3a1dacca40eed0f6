"""GGUF copies of the dense and draft checkpoints, so llama.cpp's llama-server serves the reference's function.

The GGUF is written from the checkpoint that ``checkpoint_dir`` builds, beside its model.safetensors, in F32
under llama.cpp's ``llama`` architecture (``harness.models.gguf_weights``: the RoPE permutation and the token-id
vocabulary, the definitions a llama.cpp reproducer script copies in).

The file is written to a temporary name and renamed into place, so parallel workers never see half of one;
its name carries ``GGUF_VERSION``, since the checkpoint's hash does not cover this export.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from safetensors.torch import load_file

from harness.models.checkpoints import checkpoint_dir
from harness.models.gguf_weights import write_gguf

#: the checkpoints that are LlamaForCausalLM, and so map onto llama.cpp's ``llama`` architecture
GGUF_CHECKPOINTS = ("dense", "draft")
#: bump when the export changes in a way the checkpoint's config does not show
GGUF_VERSION = 1


def gguf_file(name: str) -> Path:
    """The F32 GGUF of checkpoint ``name`` ("dense" or "draft"), written beside its safetensors on first use."""
    if name not in GGUF_CHECKPOINTS:
        raise KeyError(f"no GGUF export for checkpoint {name!r}: only {', '.join(GGUF_CHECKPOINTS)} are Llama models")
    directory = checkpoint_dir(name)
    target = directory / f"model-f32.v{GGUF_VERSION}.gguf"
    if target.is_file():
        return target
    config = json.loads((directory / "config.json").read_text())
    fd, staging = tempfile.mkstemp(prefix=".model-", suffix=".gguf", dir=directory)
    os.close(fd)
    try:
        write_gguf(Path(staging), config, load_file(directory / "model.safetensors"), name=name)
        os.chmod(staging, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(staging, target)
    finally:
        Path(staging).unlink(missing_ok=True)
    return target
