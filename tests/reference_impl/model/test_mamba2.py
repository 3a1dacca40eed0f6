"""The Mamba2 mixer's SSD math: chunked scan vs recurrence, split/resumed prefill vs one run vs decode."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.config import Mamba2Config
from reference_impl.model.mamba2 import Mamba2Mixer, ssd_chunked_scan

TOL = 1e-5          # fp32 relative tolerance from the brief
CFG = Mamba2Config(hidden=64, chunk_size=8)
FAST = settings(max_examples=40, deadline=None)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference relative to the reference's max magnitude."""
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    """Fail with the measured relative error and the name of the quantity that differs."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    err = rel_err(got, ref)
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


def naive_scan(x, dt, A, B, C, h0):
    """Token-by-token float64 recurrence h = h·exp(Δ·A) + Δ·x⊗B, y = h·C; states after each token."""
    x, dt, A, B, C, h = (t.double() for t in (x, dt, A, B, C, h0))
    ys, states = [], []
    for t in range(x.shape[0]):
        h = h * torch.exp(dt[t] * A)[:, None, None] + (x[t] * dt[t, :, None])[:, :, None] * B[t]
        ys.append(h @ C[t])
        states.append(h)
    return torch.stack(ys), states


def scan_inputs(seed: int, T: int, H: int = 4, P: int = 8, N: int = 16):
    """Random SSD inputs with mamba2-like scales: Δ = softplus(randn - 2), A in [-16, -1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, P, generator=g)
    dt = F.softplus(torch.randn(T, H, generator=g) - 2)
    A = -torch.exp(torch.rand(H, generator=g) * 2.77)
    B, C = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    return x, dt, A, B, C, torch.randn(H, P, N, generator=g)


@FAST
@given(T=st.integers(1, 80), start_pos=st.integers(0, 40), chunk_size=st.sampled_from([1, 2, 3, 5, 8, 16, 64]),
       seed=st.integers(0, 2**16))
def test_chunked_scan_matches_recurrence(T: int, start_pos: int, chunk_size: int, seed: int) -> None:
    """Chunked SSD == token recurrence for y, the final state and every grid boundary state."""
    x, dt, A, B, C, h0 = scan_inputs(seed, T)
    y, final, boundary = ssd_chunked_scan(x, dt, A, B, C, chunk_size=chunk_size, initial_state=h0, start_pos=start_pos)
    y_ref, states = naive_scan(x, dt, A, B, C, h0)
    assert_close("y", y, y_ref)
    assert_close("final_state", final, states[-1])
    grid = [p for p in range(start_pos + 1, start_pos + T + 1) if p % chunk_size == 0]
    assert sorted(boundary) == grid, f"boundary positions {sorted(boundary)} != chunk ends {grid}"
    for p, state in boundary.items():
        assert_close(f"boundary_states[{p}]", state, states[p - start_pos - 1])


@pytest.fixture(scope="module")
def mixer() -> Mamba2Mixer:
    """One seeded mixer shared by the tests (it holds no per-request state)."""
    return Mamba2Mixer(CFG, torch.Generator().manual_seed(1234))


def hidden_states(seed: int, T: int) -> torch.Tensor:
    """Random O(1) hidden states for T tokens."""
    return torch.randn(T, CFG.hidden, generator=torch.Generator().manual_seed(seed))


def zero_states() -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh request's (conv, ssm) states."""
    return torch.zeros(CFG.conv_state_shape()), torch.zeros(CFG.ssm_state_shape())


@FAST
@given(T=st.integers(2, 48), cuts=st.sets(st.integers(1, 47), max_size=4), seed=st.integers(0, 2**16))
def test_split_extends_match_single_extend(mixer: Mamba2Mixer, T: int, cuts: set[int], seed: int) -> None:
    """Prefill cut into pieces with the states carried == one prefill of the whole sequence."""
    hidden = hidden_states(seed, T)
    whole = mixer.forward_extend(hidden, *zero_states(), start_pos=0)
    conv, ssm = zero_states()
    outs = []
    bounds = [0, *sorted(c for c in cuts if c < T), T]
    for lo, hi in zip(bounds, bounds[1:]):
        res = mixer.forward_extend(hidden[lo:hi], conv, ssm, start_pos=lo)
        outs.append(res.out)
        conv, ssm = res.conv_state, res.ssm_state
    assert_close(f"out split at {bounds}", torch.cat(outs), whole.out)
    assert_close("conv_state", conv, whole.conv_state)
    assert_close("ssm_state", ssm, whole.ssm_state)


@pytest.mark.parametrize("start_pos", [0, 5, 16])
def test_extend_matches_decode_steps(mixer: Mamba2Mixer, start_pos: int) -> None:
    """Prefill == the same tokens fed one by one through batched decode, from a mid-sequence state."""
    hidden = hidden_states(7, start_pos + 30)
    prefix = mixer.forward_extend(hidden[:start_pos], *zero_states(), start_pos=0)
    res = mixer.forward_extend(hidden[start_pos:], prefix.conv_state, prefix.ssm_state, start_pos=start_pos)
    conv, ssm = prefix.conv_state[None], prefix.ssm_state[None]
    outs = []
    for t in range(start_pos, hidden.shape[0]):
        out, conv, ssm = mixer.forward_decode(hidden[t:t + 1], conv, ssm)
        outs.append(out)
    assert_close("out", torch.cat(outs), res.out)
    assert_close("conv_state", conv[0], res.conv_state)
    assert_close("ssm_state", ssm[0], res.ssm_state)


def test_decode_batches_requests_independently(mixer: Mamba2Mixer) -> None:
    """A batched decode step == each request's step alone (rows do not mix)."""
    hidden = hidden_states(3, 3)
    g = torch.Generator().manual_seed(5)
    conv = torch.randn(3, *CFG.conv_state_shape(), generator=g)
    ssm = torch.randn(3, *CFG.ssm_state_shape(), generator=g)
    batched = mixer.forward_decode(hidden, conv, ssm)
    for i in range(3):
        alone = mixer.forward_decode(hidden[i:i + 1], conv[i:i + 1], ssm[i:i + 1])
        for name, got, ref in zip(("out", "conv", "ssm"), batched, alone):
            assert_close(f"{name}[{i}]", got[i:i + 1], ref)


@FAST
@given(T=st.integers(1, 40), points=st.sets(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_snapshots_equal_prefix_states(mixer: Mamba2Mixer, T: int, points: set[int], seed: int) -> None:
    """Snapshot at p == the states of a run over positions < p, on or off the chunk grid."""
    hidden = hidden_states(seed, 40)
    start = 3
    prefix = mixer.forward_extend(hidden[:start], *zero_states(), start_pos=0)
    res = mixer.forward_extend(hidden[start:start + T], prefix.conv_state, prefix.ssm_state,
                               start_pos=start, checkpoints=sorted(points))
    expected = sorted(p for p in points if start < p <= start + T)
    assert sorted(res.snapshots) == expected, f"snapshots at {sorted(res.snapshots)}, asked for {expected}"
    for p, (conv, ssm) in res.snapshots.items():
        ref = mixer.forward_extend(hidden[:p], *zero_states(), start_pos=0)
        assert_close(f"conv snapshot[{p}]", conv, ref.conv_state)
        assert_close(f"ssm snapshot[{p}]", ssm, ref.ssm_state)


@FAST
@given(T=st.integers(9, 60), grid=st.sets(st.integers(1, 7), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_resume_from_grid_snapshot_is_bitwise(mixer: Mamba2Mixer, T: int, grid: set[int], seed: int) -> None:
    """Resuming at a chunk-grid snapshot reproduces the uninterrupted run bit for bit."""
    hidden = hidden_states(seed, T)
    points = [k * CFG.chunk_size for k in sorted(grid) if k * CFG.chunk_size < T]
    plain = mixer.forward_extend(hidden, *zero_states(), start_pos=0)
    full = mixer.forward_extend(hidden, *zero_states(), start_pos=0, checkpoints=points)
    assert torch.equal(full.out, plain.out), "grid checkpoints changed the outputs"
    for p in points:
        # A new request's tokens live elsewhere: hand them over at a 4-byte offset (misaligned).
        moved = torch.empty(hidden[p:].numel() + 1)[1:].view_as(hidden[p:]).copy_(hidden[p:])
        resumed = mixer.forward_extend(moved, *full.snapshots[p], start_pos=p)
        diff = (resumed.out - full.out[p:]).abs().max().item()
        assert torch.equal(resumed.out, full.out[p:]), f"resume at {p}: outputs differ by up to {diff:.3e}"
        assert torch.equal(resumed.ssm_state, full.ssm_state), f"resume at {p}: final ssm_state differs"
        assert torch.equal(resumed.conv_state, full.conv_state), f"resume at {p}: final conv_state differs"


def test_conv_state_holds_last_raw_inputs(mixer: Mamba2Mixer) -> None:
    """conv_state[:, j] == raw xBC of position p - d_conv + j, zeros before position 0."""
    hidden = hidden_states(11, 6)
    xbc = (hidden @ mixer.in_proj.T)[:, CFG.d_inner:CFG.d_inner + CFG.conv_dim]
    for p in (2, 6):
        conv = mixer.forward_extend(hidden[:p], *zero_states(), start_pos=0).conv_state
        expected = torch.cat([torch.zeros(max(CFG.d_conv - p, 0), CFG.conv_dim), xbc[max(p - CFG.d_conv, 0):p]])
        assert_close(f"conv_state after {p} tokens", conv, expected.T)


def test_inputs_and_snapshots_are_not_mutated(mixer: Mamba2Mixer) -> None:
    """No method writes into its inputs, and snapshots do not alias the returned working state."""
    g = torch.Generator().manual_seed(9)
    hidden = hidden_states(2, 20)
    conv, ssm = torch.randn(CFG.conv_state_shape(), generator=g), torch.randn(CFG.ssm_state_shape(), generator=g)
    before = [t.clone() for t in (hidden, conv, ssm)]
    res = mixer.forward_extend(hidden, conv, ssm, start_pos=4, checkpoints=[8, 24])
    mixer.forward_decode(hidden[:2], conv.expand(2, -1, -1).clone(), ssm.expand(2, -1, -1, -1).clone())
    out, conv_b, ssm_b = mixer.forward_decode(hidden[:1], conv[None], ssm[None])
    for name, now, then in zip(("hidden", "conv_state", "ssm_state"), (hidden, conv, ssm), before):
        assert torch.equal(now, then), f"{name} was modified in place"
    snap = [t.clone() for t in res.snapshots[24]]
    res.conv_state.add_(1.0)
    res.ssm_state.add_(1.0)
    assert torch.equal(res.snapshots[24][0], snap[0]) and torch.equal(res.snapshots[24][1], snap[1]), \
        "snapshot at the last position aliases the returned working state"
    x, dt, A, B, C, h0 = scan_inputs(0, 20)
    h0_before = h0.clone()
    _, final, _ = ssd_chunked_scan(x[:0], dt[:0], A, B[:0], C[:0], chunk_size=8, initial_state=h0, start_pos=0)
    final.add_(1.0)
    assert torch.equal(h0, h0_before), "an empty scan returned its initial_state itself"


def test_same_computation_is_bitwise_deterministic() -> None:
    """Same seed and inputs twice -> identical weights, outputs, states and snapshots."""
    runs = []
    for _ in range(2):
        m = Mamba2Mixer(CFG, torch.Generator().manual_seed(77))
        res = m.forward_extend(hidden_states(4, 30), *zero_states(), start_pos=0, checkpoints=[13, 16])
        runs.append([res.out, res.conv_state, res.ssm_state, *res.snapshots[13], *res.snapshots[16]])
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"tensor {i} differs between two identical runs"


def test_outputs_depend_on_input_and_history(mixer: Mamba2Mixer) -> None:
    """Outputs are O(1), vary across tokens, and the same token after a different prefix differs."""
    hidden = hidden_states(5, 24)
    out = mixer.forward_extend(hidden, *zero_states(), start_pos=0).out
    assert 0.1 < out.std().item() < 10, f"output std {out.std().item():.3g} is not O(1)"
    assert out.std(dim=0).min().item() > 1e-3, "some output feature is constant across tokens"
    other = hidden.clone()
    other[:12] = hidden_states(6, 12)
    out_other = mixer.forward_extend(other, *zero_states(), start_pos=0).out
    assert rel_err(out_other[12:], out[12:]) > 1e-3, "same tokens after a different prefix gave the same output"


def test_config_rejects_bad_shapes() -> None:
    """A head_dim that does not divide d_inner, or a zero size, is named in the error."""
    with pytest.raises(ValueError, match="head_dim"):
        Mamba2Config(hidden=64, head_dim=24)
    with pytest.raises(ValueError, match="chunk_size"):
        Mamba2Config(hidden=64, chunk_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_extend_matches_decode_and_cpu() -> None:
    """On CUDA: same seeded weights as on CPU, prefill == decode steps, and bitwise resume at the grid."""
    cpu = Mamba2Mixer(CFG, torch.Generator().manual_seed(1234))
    gpu = Mamba2Mixer(CFG, torch.Generator().manual_seed(1234), device="cuda")
    hidden = hidden_states(8, 40)
    conv, ssm = zero_states()
    res = gpu.forward_extend(hidden.cuda(), conv.cuda(), ssm.cuda(), start_pos=0, checkpoints=[16])
    ref = cpu.forward_extend(hidden, conv, ssm, start_pos=0)
    assert_close("cuda vs cpu out", res.out.cpu(), ref.out, tol=1e-4)
    c, s, outs = conv.cuda()[None], ssm.cuda()[None], []
    for t in range(40):
        out, c, s = gpu.forward_decode(hidden[t:t + 1].cuda(), c, s)
        outs.append(out)
    assert_close("cuda decode vs extend", torch.cat(outs), res.out, tol=1e-4)
    resumed = gpu.forward_extend(hidden[16:].cuda(), *res.snapshots[16], start_pos=16)
    assert torch.equal(resumed.out, res.out[16:]), "cuda resume at 16 is not bitwise equal"
