"""Draft heads: EAGLE-like ("sidecar") and DeepSeek MTP ("packed"), one layer each, sharing the target's head.

EAGLE: fc(cat(embedding of t+1, target hidden at t)) → one attention layer of its own geometry.
MTP: eh_proj(cat(norm(embedding of t+1), norm(hidden at t))) → one layer of the target's geometry,
numbered ``num_layers`` (after the base layers), its K/V a tail layer of the target's pool.

Nothing is trained: the weights derive from the target's, plus seeded noise, so the draft
agrees with the target often but not always. Its single attention layer has its own
geometry (fewer KV heads, wider heads) and its K/V live in the draft's own paged pool; the
layer reads the earlier positions' draft K/V, so proposals depend on that state (lose it
and the accept length falls while every emitted token stays the target's).
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import torch
from torch import nn

from reference_impl.config import ModelConfig
from reference_impl.model.tiny_lm import TinyLM, apply_rope, linear_for, rms_norm

#: fraction of seeded noise mixed into every derived weight: agreement high, never perfect.
DRAFT_NOISE = 0.35
#: size (per coordinate, like the embeddings) of a fixed offset the fc adds to every draft input;
#: the attention layer cancels it by averaging it back out of the earlier positions' values, so
#: the draft is only as good as the K/V it reads (zeroed or stale K/V leave the offset in place).
OFFSET = 2.0


def draft_config(target: ModelConfig) -> ModelConfig:
    """The draft layer's geometry: one attention layer, half the KV heads, twice the head dim."""
    return dataclasses.replace(
        target, name=f"{target.name}-draft", layer_types=("attention",),
        num_heads=max(1, target.num_heads // 2), num_kv_heads=max(1, target.num_kv_heads // 2),
        head_dim=target.head_dim * 2, seed=target.seed + 1,
    )


def mtp_config(target: ModelConfig) -> ModelConfig:
    """The MTP layer's geometry: the target's own (its K/V is one more layer of the target's pool)."""
    return dataclasses.replace(target, name=f"{target.name}-mtp", layer_types=("attention",), seed=target.seed + 2)


def packed_config(target: ModelConfig) -> ModelConfig:
    """The target's pool layout with the MTP layer's K/V as one more attention layer at the tail."""
    return dataclasses.replace(target, layer_types=(*target.layer_types, "attention"))


class DraftHead(nn.Module):
    """Draft hidden for each packed row from (next token, target-or-draft hidden), reading its own KV."""

    def __init__(self, target: TinyLM, cfg: ModelConfig, normed_inputs: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.normed_inputs = normed_inputs
        gen = torch.Generator().manual_seed(cfg.seed)
        hidden, q_dim, kv_dim = cfg.hidden, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim

        def noisy(base: torch.Tensor) -> nn.Parameter:
            noise = torch.randn(base.shape, generator=gen) * base.std()
            return nn.Parameter((1 - DRAFT_NOISE) * base + DRAFT_NOISE * noise, requires_grad=False)

        eye = torch.eye(hidden)
        self.fc = noisy(torch.cat([eye, 0.5 * eye], dim=1))
        self.wq = noisy(torch.randn(q_dim, hidden, generator=gen) / math.sqrt(hidden))
        self.wk = noisy(torch.randn(kv_dim, hidden, generator=gen) / math.sqrt(hidden))
        direction = torch.randn(hidden, generator=gen)
        direction /= direction.norm()
        self.offset = nn.Parameter(direction * OFFSET * math.sqrt(hidden), requires_grad=False)
        # v carries each position's offset component; wo turns the heads' average of it into -offset.
        kv_starts = torch.zeros(kv_dim)
        kv_starts[:: cfg.head_dim] = 1.0
        self.wv = nn.Parameter(torch.outer(kv_starts, direction), requires_grad=False)
        gain = math.sqrt(1.25 + OFFSET**2) / cfg.num_heads
        head_starts = torch.zeros(q_dim)
        head_starts[:: cfg.head_dim] = 1.0
        self.wo = noisy(-gain * torch.outer(direction, head_starts))
        self.norm = nn.Parameter(torch.ones(hidden), requires_grad=False)
        self.embed, self.lm_head, self.final_norm = target.embed, target.lm_head, target.final_norm
        self.to(device=target.embed.device, dtype=target.embed.dtype)

    @torch.no_grad()
    def project(self, next_ids: torch.Tensor, hidden: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The layer input fc(cat(embedding of the next token, hidden)) for each row (both normed for MTP)."""
        embedded = self.embed[next_ids]
        if self.normed_inputs:
            eps = self.cfg.rms_eps
            embedded, hidden = rms_norm(embedded, self.norm, eps), rms_norm(hidden, self.norm, eps)
        return linear_for(deterministic)(torch.cat([embedded, hidden], dim=-1), self.fc) + self.offset

    @torch.no_grad()
    def qkv(self, x: torch.Tensor, positions: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, ...]:
        """Rotated q, k and v of the layer inputs ``x`` at ``positions``."""
        cfg, linear = self.cfg, linear_for(deterministic)
        normed = rms_norm(x, self.norm, cfg.rms_eps)
        q = apply_rope(linear(normed, self.wq).view(-1, cfg.num_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(linear(normed, self.wk).view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, linear(normed, self.wv).view(-1, cfg.num_kv_heads, cfg.head_dim)

    @torch.no_grad()
    def finish(self, x: torch.Tensor, attn: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Draft hidden after the attention residual, final-normed like the target's."""
        out = x + linear_for(deterministic)(attn.reshape(x.shape[0], -1), self.wo)
        return rms_norm(out, self.final_norm, self.cfg.rms_eps)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The target's LM head on draft hiddens (shared, as in EAGLE)."""
        return linear_for(deterministic)(hidden, self.lm_head)


@lru_cache(maxsize=8)
def load_draft(target: TinyLM) -> DraftHead:
    """The seeded EAGLE-like draft head of ``target``; read-only, shared by engines like the target."""
    return DraftHead(target, draft_config(target.cfg), normed_inputs=False)


@lru_cache(maxsize=8)
def load_mtp(target: TinyLM) -> DraftHead:
    """The seeded MTP layer of ``target``; read-only, shared by engines like the target."""
    return DraftHead(target, mtp_config(target.cfg), normed_inputs=True)
