"""The checkpoints a reproducer script rebuilds inline, by name: each one's config.json, its seed, and for the dense
model's family the layers the seed's draw covers (the dense model's: the draft is its first layer, the EAGLE head its
layers behind a zero one). A script copies the definitions of ``harness.models.weights`` that draw them, so it serves
the weights the cell served. Below every engine package: vLLM's script writer and llama.cpp's both read them."""
from __future__ import annotations

from harness.models.checkpoints import EAGLE, HYBRID_SEED, SERVED_DENSE, draft_config, hybrid_config, llama_config

RECIPES = {
    "dense": {"config": llama_config(SERVED_DENSE), "seed": SERVED_DENSE.seed,
              "layers_drawn": len(SERVED_DENSE.layer_types)},
    "draft": {"config": llama_config(draft_config()), "seed": SERVED_DENSE.seed,
              "layers_drawn": len(SERVED_DENSE.layer_types)},
    "eagle": {"config": llama_config(EAGLE, architecture="EagleLlamaForCausalLM"), "seed": SERVED_DENSE.seed,
              "layers_drawn": len(SERVED_DENSE.layer_types), "head": "eagle"},
    "hybrid": {"config": hybrid_config(), "seed": HYBRID_SEED},
}
