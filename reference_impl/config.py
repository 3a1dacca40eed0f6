"""Configuration dataclasses: the tiny model's shape and the engine's knobs."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True, slots=True)
class Mamba2Config:
    """Shape of one Mamba2 mixer (n_groups = 1)."""

    hidden: int
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    head_dim: int = 16
    chunk_size: int = 16

    def __post_init__(self) -> None:
        """Reject shapes the mixer cannot build, naming the field at fault."""
        for name in ("hidden", "d_state", "d_conv", "expand", "head_dim", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"Mamba2Config.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_inner % self.head_dim:
            raise ValueError(f"Mamba2Config: d_inner={self.d_inner} is not a multiple of head_dim={self.head_dim}")

    @property
    def d_inner(self) -> int:
        """Width of the SSM branch (x and z)."""
        return self.expand * self.hidden

    @property
    def nheads(self) -> int:
        """Number of SSM heads, each with its own scalar A, Δ and D."""
        return self.d_inner // self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: x, B and C."""
        return self.d_inner + 2 * self.d_state

    def conv_state_shape(self) -> tuple[int, int]:
        """Shape of one request's conv state: the last d_conv raw xBC inputs."""
        return (self.conv_dim, self.d_conv)

    def ssm_state_shape(self) -> tuple[int, int, int]:
        """Shape of one request's SSM state h."""
        return (self.nheads, self.head_dim, self.d_state)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the tiny seeded language model; ``layer_types`` picks attention or Mamba2 per layer."""

    name: str
    layer_types: tuple[str, ...]
    vocab_size: int = 256
    hidden: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 1234
    mamba: Mamba2Config = field(default_factory=lambda: Mamba2Config(hidden=64))
    #: a trained model's Llama checkpoint (one safetensors file) whose weights replace the seeded ones; None: seeded
    weights: str | None = None
    #: end-of-generation tokens no step chooses: every request asks for exactly its max_new_tokens, and the engines
    #: mask these until then (vLLM's min_tokens processor censors the EOS, llama.cpp's ignore_eos biases it to -inf);
    #: the logprobs stay the raw ones, as vLLM returns them
    stop_tokens: tuple[int, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    def layer_kind(self, layer: int) -> str:
        """``layer_types[layer]``, bounds-checked: a layer past the table (an MTP layer) is attention."""
        return self.layer_types[layer] if 0 <= layer < self.num_layers else "attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Model layer indices that hold attention, in order; their position is the KV-pool layer."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "attention")

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        """Model layer indices that hold a Mamba2 mixer; their position is the state-pool layer."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "mamba")

    @property
    def is_hybrid(self) -> bool:
        return bool(self.mamba_layers)


DENSE = ModelConfig(name="dense", layer_types=("attention",) * 4)
HYBRID = ModelConfig(name="hybrid", layer_types=("attention", "mamba", "attention", "mamba"))
#: DENSE at head_dim 32, the one change vLLM's CPU attention needs (its kernels start at head_dim 32; 16 fails
#: every forward): exported as a Llama checkpoint (harness/models/checkpoints.py), both engines serve one function;
#: a matrix names it by import path, ``model = ["reference_impl.config:DENSE32"]``.
DENSE32 = replace(DENSE, name="dense32", head_dim=32)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an Engine needs; factor levels arrive here already resolved by the registry."""

    model: ModelConfig
    scheduler: type
    cache: type
    pool: type
    backend: type
    page_size: int = 1
    num_pages: int = 512
    num_state_slots: int = 64
    state_interval: int = 32
    max_running: int = 16
    prefill_budget: int = 128
    topk: int = 5
    deterministic: bool = True
    poison: bool = False
    faults: frozenset[str] = frozenset()
    spec: type | None = None       # the proposer class (reference_impl.spec); None = plain decoding
    num_draft_tokens: int = 3      # k: draft tokens proposed per verify step
    host_pages: int | None = None  # L2 (cache=host, storage) capacity in pages; None: unbounded
    store: type | None = None      # the L3 backend class (reference_impl.cache.store.backends); used only by cache=storage
    store_location: str | None = None  # its directory or URL; None: the backend's default
    tenant: str = "default"        # the store namespace this engine reads and writes
    pd: type | None = None         # PD disaggregation: the KV transport class (reference_impl.pd); None = one engine
    pd_staging: bool = False       # PD: gather head slices into the decode side's staging ring on an even chunk grid
    decode_tp: int = 1             # PD: attention-TP shards the decode side splits the KV heads over
    pd_fail_rate: float = 0.0      # PD: seeded probability that a chunk is lost in transport
    device: str = "cpu"
    dtype: torch.dtype = torch.float32

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size
