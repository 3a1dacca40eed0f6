"""The tiny seeded language model: RoPE, RMSNorm, SwiGLU, GQA attention and Mamba2 layers.

Weights come from a seeded generator (nothing is downloaded). The LM head is built so that
the current token votes for a fixed successor (a random permutation with long cycles) and
the context moves the vote: greedy continuations are varied and prompt-dependent rather
than the single repeated token a purely random network tends to emit.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from reference_impl.config import ModelConfig
from reference_impl.model import batch_invariant
from reference_impl.model.forward_batch import ForwardBatch
from reference_impl.model.mamba2 import Mamba2Mixer

NanSentinel = Callable[[str, torch.Tensor], None]
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fast_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` through BLAS: fastest, but a row's bits depend on the batch's shape."""
    return x @ weight.T


def _init(shape: tuple[int, ...], gen: torch.Generator, gain: float = 1.0) -> nn.Parameter:
    fan_in = shape[-1]
    return nn.Parameter(torch.randn(shape, generator=gen) * gain / math.sqrt(fan_in), requires_grad=False)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x: (T, heads, head_dim) at absolute positions."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos()[:, None, :].to(x.dtype), angles.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@dataclass(slots=True)
class LayerContext:
    """What a layer needs besides its input: the batch, the pools, the backend, the NaN sentinel."""

    batch: ForwardBatch
    pools: object
    backend: object
    sentinel: NanSentinel
    linear: Linear
    deterministic: bool


class Attention(nn.Module):
    """GQA attention whose K/V live in the paged pool; ``attn_layer`` is its KV-pool layer."""

    def __init__(self, cfg: ModelConfig, attn_layer: int, gen: torch.Generator) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_layer = attn_layer
        self.wq = _init((cfg.num_heads * cfg.head_dim, cfg.hidden), gen)
        self.wk = _init((cfg.num_kv_heads * cfg.head_dim, cfg.hidden), gen)
        self.wv = _init((cfg.num_kv_heads * cfg.head_dim, cfg.hidden), gen)
        self.wo = _init((cfg.hidden, cfg.num_heads * cfg.head_dim), gen)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        cfg, batch = self.cfg, ctx.batch
        q = ctx.linear(x, self.wq).view(-1, cfg.num_heads, cfg.head_dim)
        k = ctx.linear(x, self.wk).view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = ctx.linear(x, self.wv).view(-1, cfg.num_kv_heads, cfg.head_dim)
        q = apply_rope(q, batch.positions, cfg.rope_theta)
        k = apply_rope(k, batch.positions, cfg.rope_theta)
        ctx.pools.write_kv(self.attn_layer, batch.out_cache_loc, k, v)
        k_view, v_view = ctx.pools.kv_views(self.attn_layer)
        out = ctx.backend.forward(q, k, v, k_view, v_view, batch)
        ctx.sentinel(f"attention[{self.attn_layer}]", out)
        return ctx.linear(out.reshape(-1, cfg.num_heads * cfg.head_dim), self.wo)


class MambaLayer(nn.Module):
    """A Mamba2 mixer whose per-request states live in the state pool; ``mamba_layer`` is its pool layer."""

    def __init__(self, cfg: ModelConfig, mamba_layer: int, gen: torch.Generator) -> None:
        super().__init__()
        self.mamba_layer = mamba_layer
        self.mixer = Mamba2Mixer(cfg.mamba, gen)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        batch = ctx.batch
        conv, ssm = ctx.pools.state_views(self.mamba_layer)
        slots = batch.state_slots
        if batch.verify:
            return self._verify(x, ctx, conv, ssm)
        if batch.is_decode:
            out, conv_new, ssm_new = self.mixer.forward_decode(x, conv[slots], ssm[slots], deterministic=ctx.deterministic)
            conv[slots], ssm[slots] = conv_new, ssm_new
            ctx.sentinel(f"mamba_state[{self.mamba_layer}]", ssm_new)
            return out
        out = torch.empty_like(x)
        for r, slot in enumerate(slots):
            q0, q1 = batch.qo_indptr[r], batch.qo_indptr[r + 1]
            checkpoints = batch.checkpoints[r]
            res = self.mixer.forward_extend(
                x[q0:q1], conv[slot], ssm[slot], start_pos=batch.prefix_lens[r], checkpoints=sorted(checkpoints)
            )
            out[q0:q1] = res.out
            conv[slot], ssm[slot] = res.conv_state, res.ssm_state
            for pos, (snap_conv, snap_ssm) in res.snapshots.items():
                conv[checkpoints[pos]], ssm[checkpoints[pos]] = snap_conv, snap_ssm
            ctx.sentinel(f"mamba_state[{self.mamba_layer}]", res.ssm_state)
        return out

    def _verify(self, x: torch.Tensor, ctx: LayerContext, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """Verify step: the recurrent step token by token (the bits a plain decode gets), keeping every state."""
        batch = ctx.batch
        scratch = batch.verify_scratch
        if scratch is None:
            raise RuntimeError("a verify step on an engine built without verify scratch (a PD prefill server never verifies)")
        out = torch.empty_like(x)
        for r, slot in enumerate(batch.state_slots):
            q0 = batch.qo_indptr[r]
            for row in range(q0, batch.qo_indptr[r + 1]):
                res, conv_new, ssm_new = self.mixer.forward_decode(
                    x[row : row + 1], conv[[slot]], ssm[[slot]], deterministic=ctx.deterministic
                )
                out[row] = res[0]
                conv[slot], ssm[slot] = conv_new[0], ssm_new[0]
                scratch.conv[self.mamba_layer][r, row - q0] = conv_new[0]
                scratch.ssm[self.mamba_layer][r, row - q0] = ssm_new[0]
            ctx.sentinel(f"mamba_state[{self.mamba_layer}]", ssm[slot])
        return out


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, cfg: ModelConfig, gen: torch.Generator) -> None:
        super().__init__()
        self.w_gate = _init((cfg.ffn, cfg.hidden), gen)
        self.w_up = _init((cfg.ffn, cfg.hidden), gen)
        self.w_down = _init((cfg.hidden, cfg.ffn), gen)

    def forward(self, x: torch.Tensor, linear: Linear) -> torch.Tensor:
        return linear(nn.functional.silu(linear(x, self.w_gate)) * linear(x, self.w_up), self.w_down)


class Block(nn.Module):
    """Pre-norm residual block: mixer (attention or Mamba2), then SwiGLU."""

    def __init__(self, cfg: ModelConfig, mixer: nn.Module) -> None:
        super().__init__()
        self.eps = cfg.rms_eps
        self.norm1 = nn.Parameter(torch.ones(cfg.hidden), requires_grad=False)
        self.norm2 = nn.Parameter(torch.ones(cfg.hidden), requires_grad=False)
        self.mixer = mixer

    def forward(self, x: torch.Tensor, ctx: LayerContext, mlp: MLP) -> torch.Tensor:
        x = x + self.mixer(rms_norm(x, self.norm1, self.eps), ctx)
        return x + mlp(rms_norm(x, self.norm2, self.eps), ctx.linear)


class TinyLM(nn.Module):
    """The reference model. ``forward`` returns the hidden states of every packed token."""

    def __init__(self, cfg: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embed = nn.Parameter(torch.randn(cfg.vocab_size, cfg.hidden, generator=gen), requires_grad=False)
        attn_index = {layer: i for i, layer in enumerate(cfg.attention_layers)}
        mamba_index = {layer: i for i, layer in enumerate(cfg.mamba_layers)}
        blocks, mlps = [], []
        for layer, kind in enumerate(cfg.layer_types):
            mixer = Attention(cfg, attn_index[layer], gen) if kind == "attention" else MambaLayer(cfg, mamba_index[layer], gen)
            blocks.append(Block(cfg, mixer))
            mlps.append(MLP(cfg, gen))
        self.blocks = nn.ModuleList(blocks)
        self.mlps = nn.ModuleList(mlps)
        self.final_norm = nn.Parameter(torch.ones(cfg.hidden), requires_grad=False)
        successor = torch.randperm(cfg.vocab_size, generator=gen)
        head = torch.empty_like(self.embed)
        head[successor] = self.embed.detach().clone()
        noise = torch.randn(cfg.vocab_size, cfg.hidden, generator=gen)
        self.lm_head = nn.Parameter((head + 0.5 * noise) / math.sqrt(cfg.hidden), requires_grad=False)
        self.to(device=device, dtype=dtype)

    @torch.no_grad()
    def forward(
        self, batch: ForwardBatch, pools: object, backend: object, sentinel: NanSentinel, *, deterministic: bool = False
    ) -> torch.Tensor:
        """Hidden states (T, hidden) after the final norm, for every packed token of ``batch``."""
        ctx = LayerContext(batch, pools, backend, sentinel, linear_for(deterministic), deterministic)
        x = self.embed[batch.input_ids]
        for block, mlp in zip(self.blocks, self.mlps):
            x = block(x, ctx, mlp)
        return rms_norm(x, self.final_norm, self.cfg.rms_eps)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, *, deterministic: bool = False) -> torch.Tensor:
        return linear_for(deterministic)(hidden, self.lm_head)

    @torch.no_grad()
    def sequence_logits(self, tokens: Sequence[int], *, layers: int | None = None) -> torch.Tensor:
        """Logits (T, vocab) of one sequence through its first ``layers`` decoder layers (all by default), the final
        norm and the LM head: the served function with plain causal attention, no pools, no batch and no engine, so
        that what a proposer running this model must draft is known apart from any engine's mechanism."""
        cfg, blocks = self.cfg, list(zip(self.blocks, self.mlps))[:layers]
        if any(not isinstance(block.mixer, Attention) for block, _ in blocks):
            raise ValueError(f"sequence_logits: model {cfg.name!r} has Mamba2 layers; only attention runs unpaged")
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.embed.device)
        positions = torch.arange(len(ids), device=ids.device)
        causal = torch.ones(len(ids), len(ids), dtype=torch.bool, device=ids.device).tril()
        x = self.embed[ids]
        for block, mlp in blocks:
            attn, h = block.mixer, rms_norm(x, block.norm1, cfg.rms_eps)
            q = apply_rope(fast_linear(h, attn.wq).view(-1, cfg.num_heads, cfg.head_dim), positions, cfg.rope_theta)
            k = apply_rope(fast_linear(h, attn.wk).view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
            v = fast_linear(h, attn.wv).view(-1, cfg.num_kv_heads, cfg.head_dim)
            group = cfg.num_heads // cfg.num_kv_heads  # query head h reads KV head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(cfg.head_dim)
            out = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), v)
            x = x + fast_linear(out.reshape(len(ids), -1), attn.wo)
            x = x + mlp(rms_norm(x, block.norm2, cfg.rms_eps), fast_linear)
        return self.logits(rms_norm(x, self.final_norm, cfg.rms_eps))


def linear_for(deterministic: bool) -> Linear:
    """The batch-invariant linear in deterministic mode, BLAS otherwise."""
    return batch_invariant.linear if deterministic else fast_linear
