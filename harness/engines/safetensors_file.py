"""Read and write the safetensors file format, so our venv exports checkpoints without the library.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a JSON
header mapping each tensor name to its dtype, shape and byte range, then the raw little-endian bytes.
Writing it here keeps the harness venv free of one more native wheel; the writer sorts names and
packs tensors in that order, so the same tensors always give the same bytes (the cache key relies on it).
"""
from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


def save_file(tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` as one safetensors file (names sorted, data contiguous)."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"safetensors: tensor {name!r} has dtype {tensor.dtype}, not one of {list(_DTYPES)}")
        # a uint8 view gives the raw bytes for any dtype, bfloat16 included (numpy has none)
        blob = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the spec pads the header to 8 bytes so the data is aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_file(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file at ``path``, by name."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__", None)
    base = 8 + length
    out: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _TORCH_DTYPES[entry["dtype"]]
        raw = torch.frombuffer(bytearray(data[base + begin : base + end]), dtype=torch.uint8)
        out[name] = raw.view(dtype).reshape(entry["shape"])
    return out
