"""The Mamba2 mixer of the reference model: real SSD math, per-request conv and SSM states.

One token at position ``t`` goes through ``in_proj -> [z, xBC, dt]``, a depthwise causal
conv (width ``d_conv``, SiLU) over ``xBC``, the split ``x, B, C``, ``Δ = softplus(dt + dt_bias)``
and the SSD recurrence ``h = h·exp(Δ·A) + Δ·x⊗B``, ``y = h·C + D·x``; then gated RMSNorm
``rmsnorm(y · silu(z))`` and ``out_proj``. Multi-head, one B/C group, scalar ``A = -exp(A_log)``
per head.

State convention, for a request that has consumed positions ``< p``:
  * ``conv_state`` (conv_dim, d_conv): column ``j`` holds the *raw* ``xBC`` (in_proj output,
    before conv and SiLU) of position ``p - d_conv + j``, zeros where that position is < 0.
    The newest input is the last column. This is the layout of mamba's
    ``causal_conv1d_update`` (shift left, append, convolve all ``d_conv`` columns), so the
    oldest column is dropped by the next step.
  * ``ssm_state`` (nheads, head_dim, d_state): ``h`` after position ``p - 1``.

Chunk grid: prefill runs the chunked SSD scan on chunks that end at absolute multiples of
``chunk_size``, so a request resumed from a snapshot at a grid position follows the same
chunks as the uninterrupted run. ``forward_extend`` goes further and runs the whole mixer
(in_proj, conv, scan, norm, out_proj) one piece at a time, a piece being the span between
consecutive cut points (the grid, the requested checkpoints, the ends), on a fresh copy of
its input (MKL's matmul results depend on memory alignment). Every piece therefore sees the
same shapes and memory layout in any run that makes the same cuts, so resuming from a
snapshot at a grid position is bitwise equal to never stopping, and resuming from any
snapshot is bitwise equal to the run that took it. Off-grid cuts agree to fp32 rounding.

Copy-on-write: no method writes into a tensor it was given, and snapshots are fresh copies,
so a cached snapshot is never mutated by the request that resumes from it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reference_impl.config import Mamba2Config
from reference_impl.model import batch_invariant

Linear = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True, slots=True)
class ExtendResult:
    """What ``forward_extend`` returns: outputs, the states after the last token, and snapshots."""

    out: Tensor                                   # (T, hidden)
    conv_state: Tensor                            # (conv_dim, d_conv)
    ssm_state: Tensor                             # (nheads, head_dim, d_state)
    snapshots: dict[int, tuple[Tensor, Tensor]]   # position p -> (conv, ssm) after consuming < p


def _cut_points(start: int, end: int, chunk_size: int, extra: Iterable[int] = ()) -> list[int]:
    """Sorted piece boundaries of [start, end]: both ends, every grid multiple and ``extra`` inside."""
    first = (start // chunk_size + 1) * chunk_size
    inner = set(range(first, end, chunk_size)) | {p for p in extra if start < p < end}
    return [start, *sorted(inner), end] if end > start else [start]


def _segsum(a: Tensor) -> Tensor:
    """(L, H) log-decays -> (H, L, L) with [h, l, s] = sum of a[s+1..l, h], -inf above the diagonal.

    Built by a masked cumsum instead of cumsum differences so that long spans do not lose
    precision to cancellation (the stable form of mamba's ``segsum``).
    """
    length = a.shape[0]
    rep = a.transpose(0, 1)[:, :, None].expand(-1, length, length)
    lower = torch.ones(length, length, dtype=torch.bool, device=a.device).tril()
    sums = rep.masked_fill(~lower.tril(-1), 0.0).cumsum(dim=-2)
    return sums.masked_fill(~lower, -math.inf)


def _ssd_chunk(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h_in: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk of SSD: quadratic intra-chunk output plus the contribution and update of h."""
    a = dt * A                                              # (L, H) log-decay per token
    decay = torch.exp(_segsum(a))                           # (H, L, L) decay from s to l
    xdt = x * dt[:, :, None]                                # (L, H, P)
    y_diag = torch.einsum("ls,hls,shp->lhp", C @ B.T, decay, xdt)
    from_start = torch.exp(torch.cumsum(a, dim=0))          # (L, H) decay of h_in up to l
    y_off = torch.einsum("ln,hpn,lh->lhp", C, h_in, from_start)
    to_end = decay[:, -1, :].transpose(0, 1)                # (L, H) decay from s to the chunk end
    h_chunk = torch.einsum("sn,sh,shp->hpn", B, to_end, xdt)
    h_out = h_in * from_start[-1][:, None, None] + h_chunk
    return y_diag + y_off, h_out


def ssd_chunked_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *,
    chunk_size: int, initial_state: Tensor, start_pos: int,
) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
    """Chunked SSD over positions start_pos.. with chunks on the absolute grid; y excludes D·x.

    Shapes: x (T, H, P), dt (T, H) after softplus, A (H,), B and C (T, N), initial_state
    (H, P, N). Returns y (T, H, P), the final state, and ``boundary_states``: for every grid
    position p in (start_pos, start_pos + T], the state after consuming positions < p.
    """
    if chunk_size < 1 or start_pos < 0:
        raise ValueError(f"ssd_chunked_scan: need chunk_size >= 1 and start_pos >= 0, got {chunk_size}, {start_pos}")
    cuts = _cut_points(start_pos, start_pos + x.shape[0], chunk_size)
    state, ys, boundary_states = initial_state.clone(), [], {}
    for lo, hi in zip(cuts, cuts[1:]):
        sl = slice(lo - start_pos, hi - start_pos)
        y, state = _ssd_chunk(x[sl], dt[sl], A, B[sl], C[sl], state)
        ys.append(y)
        if hi % chunk_size == 0:
            boundary_states[hi] = state
    return (torch.cat(ys) if ys else torch.zeros_like(x)), state, boundary_states


def ssd_step(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One recurrent SSD step for a batch: x (b, H, P), dt (b, H), B and C (b, N), state (b, H, P, N).

    Returns y (b, H, P) without D·x, and a new state (the input state is not modified).
    """
    d_a = batch_invariant.lane_aligned(torch.exp, dt * A)[:, :, None, None]
    d_bx = (x * dt[:, :, None])[:, :, :, None] * B[:, None, None, :]
    new_state = state * d_a + d_bx
    # An explicit reduction over d_state, not an einsum: bmm's kernel (and its rounding)
    # depends on the batch size, and a request's decode must not depend on its batch.
    return (new_state * C[:, None, None, :]).sum(-1), new_state


def _causal_conv(xbc: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """Depthwise causal conv + SiLU of xbc (..., L, D) after conv_state (..., D, W); L >= 1.

    Written as an explicit sum over the W taps, in a fixed order, so that each output
    element is computed identically whatever L is (prefill pieces and decode agree).
    """
    width = weight.shape[-1]
    window = torch.cat([conv_state[..., 1:], xbc.transpose(-1, -2)], dim=-1)   # (..., D, W-1+L)
    length = xbc.shape[-2]
    acc = bias[:, None] + weight[:, :1] * window[..., :length]
    for j in range(1, width):
        acc = acc + weight[:, j:j + 1] * window[..., j:j + length]
    return F.silu(acc).transpose(-1, -2), window[..., -width:].clone()


def _check_shape(name: str, tensor: Tensor, expected: tuple[int, ...]) -> None:
    """Raise a ValueError naming ``name`` when ``tensor`` does not have shape ``expected``."""
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {expected}")


class Mamba2Mixer(nn.Module):
    """A seeded Mamba2 mixer that reads and returns per-request states (see the module docstring)."""

    def __init__(
        self, cfg: Mamba2Config, generator: torch.Generator,
        device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
    ) -> None:
        """Draw every weight from ``generator`` (mamba2's init ranges), then place them on ``device``."""
        super().__init__()
        self.cfg = cfg
        gen_dev = generator.device

        def param(values: Tensor) -> nn.Parameter:
            return nn.Parameter(values.to(device=device, dtype=dtype), requires_grad=False)

        def uniform(shape: tuple[int, ...], lo: float, hi: float) -> Tensor:
            return lo + (hi - lo) * torch.rand(shape, generator=generator, device=gen_dev)

        def normal(shape: tuple[int, ...], std: float) -> Tensor:
            return std * torch.randn(shape, generator=generator, device=gen_dev)

        d_in_proj = 2 * cfg.d_inner + 2 * cfg.d_state + cfg.nheads
        self.in_proj = param(normal((d_in_proj, cfg.hidden), 1.0 / math.sqrt(cfg.hidden)))
        bound = 1.0 / math.sqrt(cfg.d_conv)   # nn.Conv1d's default bound for a depthwise conv
        self.conv_weight = param(uniform((cfg.conv_dim, cfg.d_conv), -bound, bound))
        self.conv_bias = param(uniform((cfg.conv_dim,), -bound, bound))
        # Δ at init is log-uniform in [0.01, 0.1]; dt_bias is its inverse softplus.
        dt = torch.exp(uniform((cfg.nheads,), math.log(0.01), math.log(0.1)))
        self.dt_bias = param(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = param(torch.log(uniform((cfg.nheads,), 1.0, 16.0)))
        self.D = param(torch.ones(cfg.nheads))
        self.norm_weight = param(torch.ones(cfg.d_inner))
        self.out_proj = param(normal((cfg.hidden, cfg.d_inner), 1.0 / math.sqrt(cfg.d_inner)))

    def _project(self, hidden: Tensor, linear: Linear = F.linear) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj of (..., hidden) -> z (..., d_inner), raw xBC (..., conv_dim), raw dt (..., nheads)."""
        cfg = self.cfg
        return torch.split(linear(hidden, self.in_proj), [cfg.d_inner, cfg.conv_dim, cfg.nheads], dim=-1)

    def _ssm_inputs(self, xbc: Tensor, dt_raw: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Split conv output into x (n, H, P), B, C (n, N) and compute Δ = softplus(dt + dt_bias)."""
        cfg = self.cfg
        x, B, C = torch.split(xbc, [cfg.d_inner, cfg.d_state, cfg.d_state], dim=-1)
        x = x.reshape(x.shape[0], cfg.nheads, cfg.head_dim)
        return x, B, C, batch_invariant.lane_aligned(F.softplus, dt_raw + self.dt_bias)

    def _output(self, y: Tensor, x: Tensor, z: Tensor, linear: Linear = F.linear) -> Tensor:
        """Add D·x, apply gated RMSNorm rmsnorm(y · silu(z)) and out_proj: (n, H, P) -> (n, hidden)."""
        y = (y + self.D[:, None] * x).reshape(y.shape[0], self.cfg.d_inner)
        gated = y * F.silu(z)
        normed = gated * torch.rsqrt(gated.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * self.norm_weight
        return linear(normed, self.out_proj)

    def _extend_piece(
        self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, start_pos: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The whole mixer over one piece (inside a single chunk) of one request.

        The piece is zero-padded to the end of its chunk and run at that fixed shape, with the
        padded positions' Δ and x forced to 0 (so they leave the state untouched). Every
        matmul and reduction then has the same shape whether the piece ends at the chunk end
        or at a request's last token: a position's bits never depend on where its piece ends,
        which is what lets two requests share cached K/V computed by either of them.
        """
        cfg = self.cfg
        real = hidden.shape[0]
        width = (start_pos // cfg.chunk_size + 1) * cfg.chunk_size - start_pos
        padded = hidden.new_zeros(width, cfg.hidden)
        padded[:real] = hidden
        z, xbc_raw, dt_raw = self._project(padded)
        xbc, _ = _causal_conv(xbc_raw, conv_state, self.conv_weight, self.conv_bias)
        _, conv_state = _causal_conv(xbc_raw[:real], conv_state, self.conv_weight, self.conv_bias)
        x, B, C, dt = self._ssm_inputs(xbc, dt_raw)
        x[real:], dt[real:] = 0.0, 0.0
        A = -torch.exp(self.A_log)
        y, ssm_state, _ = ssd_chunked_scan(
            x, dt, A, B, C, chunk_size=cfg.chunk_size, initial_state=ssm_state, start_pos=start_pos,
        )
        return self._output(y, x, z)[:real], conv_state, ssm_state

    @torch.no_grad()
    def forward_extend(
        self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, *,
        start_pos: int, checkpoints: Sequence[int] = (),
    ) -> ExtendResult:
        """Run one request's new tokens (positions start_pos..) and snapshot states at ``checkpoints``.

        A checkpoint p with start_pos < p <= start_pos + T gets the (conv, ssm) state after
        consuming positions < p; others are ignored. Off-grid checkpoints cut the scan there.
        """
        cfg = self.cfg
        _check_shape("hidden", hidden, (hidden.shape[0], cfg.hidden))
        _check_shape("conv_state", conv_state, cfg.conv_state_shape())
        _check_shape("ssm_state", ssm_state, cfg.ssm_state_shape())
        if start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {start_pos}")
        end = start_pos + hidden.shape[0]
        wanted = {p for p in checkpoints if start_pos < p <= end}
        conv, ssm = conv_state.clone(), ssm_state.clone()
        outs, snapshots = [], {}
        cuts = _cut_points(start_pos, end, cfg.chunk_size, wanted)
        for lo, hi in zip(cuts, cuts[1:]):
            # A fresh copy gives every piece the same memory layout in any run (bitwise resume).
            piece = hidden[lo - start_pos:hi - start_pos].clone()
            out, conv, ssm = self._extend_piece(piece, conv, ssm, lo)
            outs.append(out)
            if hi in wanted:
                snapshots[hi] = (conv.clone(), ssm.clone())
        out = torch.cat(outs) if outs else hidden.new_zeros(0, cfg.hidden)
        return ExtendResult(out=out, conv_state=conv, ssm_state=ssm, snapshots=snapshots)

    @torch.no_grad()
    def forward_decode(
        self, hidden: Tensor, conv_state: Tensor, ssm_state: Tensor, *, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One token for each of b requests: hidden (b, hidden) -> (out, new conv_state, new ssm_state).

        ``deterministic`` projects each row on its own (batch_invariant.linear), so a request's
        output does not depend on how many others decode with it.
        """
        linear = batch_invariant.linear if deterministic else F.linear
        cfg = self.cfg
        batch = hidden.shape[0]
        _check_shape("hidden", hidden, (batch, cfg.hidden))
        _check_shape("conv_state", conv_state, (batch, *cfg.conv_state_shape()))
        _check_shape("ssm_state", ssm_state, (batch, *cfg.ssm_state_shape()))
        z, xbc_raw, dt_raw = self._project(hidden, linear)
        xbc, conv_state = _causal_conv(xbc_raw[:, None, :], conv_state, self.conv_weight, self.conv_bias)
        x, B, C, dt = self._ssm_inputs(xbc[:, 0, :], dt_raw)
        y, ssm_state = ssd_step(x, dt, -torch.exp(self.A_log), B, C, ssm_state)
        return self._output(y, x, z, linear), conv_state, ssm_state
