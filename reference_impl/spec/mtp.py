"""spec = mtp: the DeepSeek-style nextn layer ("packed"), its K/V an extra tail layer of the target's pool.

The layer is numbered ``num_layers`` (after the base layers). Per-layer tables of the model
have ``num_layers`` entries, so its own lookups go through the bounds-checked accessor; the
fault ``mtp_layer_index_oob`` (vLLM #49642) indexes the table directly and fails at load.
"""
from __future__ import annotations

from reference_impl.config import EngineConfig, ModelConfig
from reference_impl.faults import MTP_LAYER_INDEX_OOB
from reference_impl.memory.pool import Pool
from reference_impl.model.load import load_model
from reference_impl.spec.draft import DraftProposer
from reference_impl.spec.draft_model import load_mtp, packed_config



class MtpProposer(DraftProposer):
    """The draft proposer's catch-up and proposing, on the MTP layer and the target pool's tail layer."""

    def pool_model(self, model: ModelConfig) -> ModelConfig:
        """The target's layout plus one attention layer at the tail for the MTP layer's K/V."""
        return packed_config(model)

    def setup(self, target: Pool, config: EngineConfig) -> None:
        """Load the MTP layer (reading its per-layer settings) and point it at the target pool's tail layer."""
        model = config.model
        index = model.num_layers
        kind = model.layer_types[index] if MTP_LAYER_INDEX_OOB.name in config.faults else model.layer_kind(index)
        if kind != "attention":
            raise ValueError(f"MTP layer {index} must be attention, the table says {kind!r}")
        self.config = config
        self.lost: set[int] = set()
        self.head = load_mtp(load_model(model, config.device, config.dtype))
        self.kv_pool, self.kv_layer = target, len(model.attention_layers)
