"""Triton paged attention (``TritonBackend`` and the kernels it launches, ``triton_ops``) equals dense attention, reads
whole pages, and models SGLang #33517 / #33974.

On CPU the kernels run under Triton's interpreter (``reference_impl.attention.triton_ops.common`` sets
TRITON_INTERPRET=1 when no CUDA device exists); the ``cuda`` parameter runs the same checks
compiled on a GPU. Shapes stay tiny because the interpreter is slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reference_impl.attention.launch_audit import int32_overflow_risks
from reference_impl.attention.torch_backend import TorchBackend
from reference_impl.attention.triton_backend import PageAlignmentError, TritonBackend
from reference_impl.attention.triton_ops.common import INTERPRETED, INTERPRETER_SHAPES, LaunchShapes
from reference_impl.config import DENSE
from reference_impl.model.forward_batch import ForwardBatch

NOT_INTERPRETED = "Triton compiles for CUDA in this process; export TRITON_INTERPRET=1 to run these on CPU"
NO_CUDA = "needs a CUDA device with Triton compiling (not interpreting) the kernels"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason=NOT_INTERPRETED)),
    pytest.param("cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(), reason=NO_CUDA)]),
]
HKV, HQ, D = DENSE.num_kv_heads, DENSE.num_heads, DENSE.head_dim


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """SDPA of n queries at positions prefix.. over contiguous K/V, causal, GQA by repeating KV heads."""
    group = q.shape[1] // k.shape[1]
    visible = torch.arange(k.shape[0])[None, :] <= (torch.arange(q.shape[0]) + prefix)[:, None]
    k, v = (t.repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=visible).transpose(0, 1)


class Case:
    """A paged batch over scattered pages of a zero-filled pool, with its dense reference output."""

    def __init__(self, lens: list[tuple[int, int]], page_size: int, device: str, *, decode: bool = False,
                 seed: int = 0, layers: int = 1, layer: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.page_size = page_size
        num_pages = sum(-(-(p + n) // page_size) for p, n in lens) * 2 + 4
        # page-major envelopes: [page][layer][k|v][slot][head][dim]; layer ``layer`` is the one attended
        self.buffer = torch.full((num_pages, layers, 2, page_size, HKV, D), float("nan"), device=device)
        self.buffer[:, layer] = 0.0
        self.k_view, self.v_view = self.buffer[:, layer, 0], self.buffer[:, layer, 1]
        self.free_pages = torch.randperm(num_pages, generator=gen).tolist()  # scattered, non-contiguous tables
        qs, ks, vs, out_loc, kv_idx, refs, qo, kvp = [], [], [], [], [], [], [0], [0]
        for prefix, n in lens:
            total = prefix + n
            pages = [self.free_pages.pop() for _ in range(-(-total // page_size))]
            slots = torch.tensor([pages[p // page_size] * page_size + p % page_size for p in range(total)])
            k, v = (torch.randn(total, HKV, D, generator=gen) for _ in range(2))
            q = torch.randn(n, HQ, D, generator=gen)
            self.k_view[slots // page_size, slots % page_size] = k.to(device)  # prefix cached, new tokens written
            self.v_view[slots // page_size, slots % page_size] = v.to(device)
            refs.append(dense_attention(q, k, v, prefix))
            qs.append(q), ks.append(k[prefix:]), vs.append(v[prefix:]), out_loc.append(slots[prefix:])
            kv_idx.append(slots), qo.append(qo[-1] + n), kvp.append(kvp[-1] + total)
        self.q, self.k, self.v = (torch.cat(t).to(device) for t in (qs, ks, vs))
        self.ref = torch.cat(refs).to(device)
        loc = torch.cat(out_loc).to(device)
        self.batch = ForwardBatch(
            input_ids=torch.zeros(qo[-1], dtype=torch.long), positions=torch.zeros(qo[-1], dtype=torch.long),
            out_cache_loc=loc, qo_indptr=qo, kv_indptr=kvp, kv_indices=torch.cat(kv_idx).to(device),
            prefix_lens=[p for p, _ in lens], state_slots=[], checkpoints=[{} for _ in lens], is_decode=decode,
            out_cache_loc_virtual=loc,  # a static pool: virtual == physical
        )

    def run(self, backend: object) -> torch.Tensor:
        return backend.forward(self.q, self.k, self.v, self.k_view, self.v_view, self.batch)

    def single(self, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of request r alone."""
        return self.q[self.rows(r)], self.k[self.rows(r)], self.v[self.rows(r)]

    def single_batch(self, r: int) -> ForwardBatch:
        """Request r alone, over the same pool pages."""
        b = self.batch
        kv = b.kv_indices[b.kv_indptr[r] : b.kv_indptr[r + 1]]
        return ForwardBatch(
            input_ids=b.input_ids[self.rows(r)], positions=b.positions[self.rows(r)],
            out_cache_loc=b.out_cache_loc[self.rows(r)], qo_indptr=[0, b.extend_len(r)], kv_indptr=[0, len(kv)],
            kv_indices=kv, prefix_lens=[b.prefix_lens[r]], state_slots=[], checkpoints=[{}], is_decode=b.is_decode,
        )

    def last_page(self, r: int) -> int:
        """Physical page holding request r's last token."""
        return int(self.batch.kv_indices[self.batch.kv_indptr[r + 1] - 1]) // self.page_size

    def rows(self, r: int) -> slice:
        return slice(self.batch.qo_indptr[r], self.batch.qo_indptr[r + 1])


def run_child(code: str, hint: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter at the repository root and return its last line of output."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(root), **env}, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"child exited {done.returncode} ({hint})\n{done.stderr[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


def check_against_dense(case: Case, backend: TritonBackend) -> None:
    """The backend's output equals dense SDPA and the torch reference backend, to 1e-5."""
    out = case.run(backend)
    torch.testing.assert_close(out, case.ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, case.run(TorchBackend(case.page_size)), atol=1e-5, rtol=1e-5)


DECODE_LENS = [(37, 1), (3, 1), (70, 1), (0, 1), (16, 1)]
EXTEND_LENS = [(0, 19), (21, 5), (32, 3), (5, 1)]  # prefix 0, unaligned, page-aligned, single token


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("lens", [DECODE_LENS, [(150, 1)]], ids=["batch", "alone"])  # alone: most splits to merge
def test_decode_matches_dense(device: str, page_size: int, deterministic: bool, lens: list[tuple[int, int]]) -> None:
    case = Case(lens, page_size, device, decode=True)
    check_against_dense(case, TritonBackend(page_size, deterministic=deterministic))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("deterministic", [False, True], ids=["two_stage", "unified"])
def test_extend_matches_dense(device: str, page_size: int, deterministic: bool) -> None:
    case = Case(EXTEND_LENS, page_size, device, seed=1)
    check_against_dense(case, TritonBackend(page_size, deterministic=deterministic))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decode", [True, False])
def test_strided_layer_view_of_envelope_pool(device: str, decode: bool) -> None:
    """Layer 1 of a 2-layer page-major pool (page stride = 4 pages of K); the other layer's bytes are NaN."""
    case = Case(DECODE_LENS if decode else EXTEND_LENS, 4, device, decode=decode, layers=2, layer=1)
    assert case.k_view.stride(0) == 2 * 2 * 4 * HKV * D
    check_against_dense(case, TritonBackend(4, deterministic=False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 4])
def test_deterministic_decode_is_batch_invariant(device: str, page_size: int) -> None:
    """A request alone and in a batch of 8 gets bitwise the same output (fixed split tile, fixed merge order)."""
    lens = [(13 * i % 70, 1) for i in range(3)] + [(90, 1)] + [(11 * i % 50, 1) for i in range(4)]
    case = Case(lens, page_size, device, decode=True, seed=7)
    backend = TritonBackend(page_size, deterministic=True)
    in_batch = case.run(backend)[3]
    alone = backend.forward(*case.single(3), case.k_view, case.v_view, case.single_batch(3))[0]
    assert torch.equal(in_batch, alone), f"max diff {(in_batch - alone).abs().max()}"


#: SGLang's launch shapes, as the interpreter used them before it had its own (16 cores for the split heuristic).
GPU_SHAPES_ON_CPU = LaunchShapes(extend_block_m=16, kv_split_cores=16, merge_one_split=True)


SHAPE_CASES = [("decode", [(150, 1)]), ("decode", [(20, 1), (37, 1)]), ("two_stage", EXTEND_LENS),
               ("unified", EXTEND_LENS), ("unified", [(0, 70), (40, 33)])]  # decode: several splits, then one


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("kernel", "lens"), SHAPE_CASES, ids=["decode-long", "decode-short", "two_stage", "unified",
                                                                "unified-blocks"])
def test_interpreter_shapes_compute_bitwise_what_gpu_shapes_compute(page_size: int, kernel: str, lens: list) -> None:
    """Fewer, larger extend programs and no identity merge: the same bits, for every extend and deterministic decode.

    (Batch-dependent decode changes its split count with the shapes: close, not bitwise, and still dense attention.)
    """
    decode = kernel == "decode"
    case = Case(lens, page_size, "cpu", decode=decode, seed=2)
    outs = [case.run(TritonBackend(page_size, deterministic=kernel != "two_stage", shapes=shapes))
            for shapes in (GPU_SHAPES_ON_CPU, INTERPRETER_SHAPES)]
    assert torch.equal(*outs), f"max diff {(outs[0] - outs[1]).abs().max()}"
    if decode:
        varying = [case.run(TritonBackend(page_size, deterministic=False, shapes=s)) for s in (GPU_SHAPES_ON_CPU, INTERPRETER_SHAPES)]
        torch.testing.assert_close(varying[1], varying[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(varying[1], case.ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_split_plan_follows_the_batch_only_when_not_deterministic(device: str) -> None:
    """Batch-dependent mode gives a lone request more splits than one among 64; the fixed tile does not."""
    crowd, dev = [10] * 64, torch.device(device)
    fixed, varying = TritonBackend(4, deterministic=True), TritonBackend(4, deterministic=False)
    plan = lambda backend, pages: backend.split_pages(pages, num_kv_heads=HKV, device=dev)[0]  # noqa: E731
    assert plan(fixed, crowd) == plan(fixed, [10])
    assert plan(varying, [10]) < plan(varying, crowd) == 10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["decode", "two_stage", "unified"])
@pytest.mark.parametrize("poisoned", ["k", "v"])
def test_nan_in_unwritten_tail_slot_poisons_the_row(device: str, kernel: str, poisoned: str) -> None:
    """SGLang #33974 root cause 1: whole-page reads + arithmetic mask, so NaN × 0 in the tail leaks."""
    decode = kernel == "decode"
    case = Case([(6, 1), (9, 1)] if decode else [(5, 2), (9, 3)], 4, device, decode=decode, seed=3)
    backend = TritonBackend(4, deterministic=kernel != "two_stage")
    tail_slot = case.batch.seq_len(0) % 4  # seq_len 7: offset 3 of the last page was never written
    view = case.k_view if poisoned == "k" else case.v_view
    view[case.last_page(0), tail_slot] = float("nan")
    out = case.run(backend)
    assert out[case.rows(0)].isnan().all(), "NaN in the unwritten tail should poison every row of request 0"
    assert out[case.rows(1)].isfinite().all(), "request 1 does not own the poisoned page"
    view[case.last_page(0), tail_slot] = 0.0
    torch.testing.assert_close(case.run(backend), case.ref, atol=1e-5, rtol=1e-5)


def remap_new_tokens(case: Case) -> torch.Tensor:
    """Virtual slots for the new tokens: same offsets on fresh pages that hold other (random) K/V."""
    b, ps = case.batch, case.page_size
    fresh: dict[int, int] = {}
    virtual = []
    for slot in b.out_cache_loc.tolist():
        if slot // ps not in fresh:
            fresh[slot // ps] = case.free_pages.pop()
        virtual.append(fresh[slot // ps] * ps + slot % ps)
    pages = torch.tensor(list(fresh.values()))
    case.k_view[pages] = torch.randn_like(case.k_view[pages])
    case.v_view[pages] = torch.randn_like(case.v_view[pages])
    return torch.tensor(virtual, device=b.out_cache_loc.device)


@pytest.mark.parametrize("device", DEVICES)
def test_unified_extend_virtual_loc_fault_needs_all_three(device: str) -> None:
    """SGLang #33517: only unified kernel × virtual != physical × the fault reads the wrong K/V."""
    case = Case([(8, 5), (0, 6), (3, 2)], 4, device, seed=5)
    faulty = frozenset({"unified_extend_virtual_loc"})
    check_against_dense(case, TritonBackend(4, deterministic=True, faults=faulty))  # virtual == physical: harmless
    case.batch.out_cache_loc_virtual = remap_new_tokens(case)
    out = case.run(TritonBackend(4, deterministic=True, faults=faulty))
    for r in range(case.batch.batch_size):
        assert not torch.allclose(out[case.rows(r)], case.ref[case.rows(r)], atol=1e-3), f"request {r} unaffected"
    check_against_dense(case, TritonBackend(4, deterministic=False, faults=faulty))  # two-stage: new K/V from inputs
    check_against_dense(case, TritonBackend(4, deterministic=True))  # no fault: out_cache_loc is physical


@pytest.mark.parametrize("device", DEVICES)
def test_slot_stride_int32_is_recorded_and_still_right_on_a_small_pool(device: str) -> None:
    """Below 2**31 the 32-bit build is exact; every pool-reading launch is recorded with its width and stride."""
    case = Case(EXTEND_LENS, 4, device, layers=2, layer=1)
    decode = Case(DECODE_LENS, 4, device, decode=True, layers=2, layer=1)
    narrow = TritonBackend(4, faults=frozenset({"slot_stride_int32"}))
    wide = TritonBackend(4)
    for backend in (narrow, wide):
        check_against_dense(case, backend)
        check_against_dense(decode, backend)
    assert {g.kernel for g in narrow.launches} == {"extend_unified", "decode_stage1"}
    assert {g.index_bits for g in narrow.launches} == {32} and {g.index_bits for g in wide.launches} == {64}
    by_kernel = {"extend_unified": case, "decode_stage1": decode}
    for g in narrow.launches:
        assert g.stride == case.k_view.stride(0) == 2 * 2 * 4 * HKV * D
        assert g.max_index == int(by_kernel[g.kernel].batch.kv_indices.max()) // 4
    assert int32_overflow_risks(narrow.launches) == []


def read_page_4096_of_a_one_page_view(device: str, decode: bool) -> dict[str, object]:
    """Under slot_stride_int32, attend request tokens on page 4096 of a view with one real page and a 2**20 stride.

    4096 × 2**20 = 2**32 wraps to offset 0 in 32 bits, so page 0 is read: returns how far the
    output is from attention over page 0, and the geometry audit's messages.
    """
    ps, n, stride = 4, 3, 2**20
    storage = torch.zeros(2 * ps * HKV * D, device=device)
    k_view, v_view = (storage.as_strided((1, ps, HKV, D), (stride, HKV * D, D, 1), i * ps * HKV * D) for i in (0, 1))
    gen = torch.Generator().manual_seed(11)
    k, v = (torch.randn(n, HKV, D, generator=gen).to(device) for _ in range(2))
    k_view[0, :n], v_view[0, :n] = k, v
    rows = 1 if decode else n
    q = torch.randn(rows, HQ, D, generator=gen).to(device)
    batch = ForwardBatch(
        input_ids=torch.zeros(rows, dtype=torch.long), positions=torch.zeros(rows, dtype=torch.long),
        out_cache_loc=(4096 * ps + torch.arange(n - rows, n)).to(device), qo_indptr=[0, rows], kv_indptr=[0, n],
        kv_indices=(4096 * ps + torch.arange(n)).to(device), prefix_lens=[n - rows], state_slots=[], checkpoints=[{}],
        is_decode=decode,
    )
    backend = TritonBackend(ps, faults=frozenset({"slot_stride_int32"}))
    out = backend.forward(q, k[n - rows :], v[n - rows :], k_view, v_view, batch).cpu()
    page_0 = dense_attention(q.cpu(), k.cpu(), v.cpu(), n - rows)
    return {"diff_from_page_0": float((out - page_0).abs().max()), "risks": int32_overflow_risks(backend.launches)}


@pytest.mark.parametrize("device", DEVICES)
def test_int32_offsets_wrap_onto_another_page(device: str) -> None:
    """slot_stride_int32 really computes page × stride in 32 bits: page 4096 reads page 0's bytes.

    Runs in a child process: were the offsets 64-bit, the read would land 16 GiB past the
    view and crash (or, on CUDA, poison the context) instead of failing.
    """
    code = (
        "import json; from tests.reference_impl.attention.test_triton_backend import read_page_4096_of_a_one_page_view as read; "
        f"print(json.dumps([read({device!r}, decode) for decode in (True, False)]))"
    )
    for result in json.loads(run_child(code, "did the offsets stop wrapping?")):
        assert result["diff_from_page_0"] < 1e-5, result
        (risk,) = result["risks"]
        assert "page 4096" in risk and "1048576" in risk


def test_unaligned_sequence_is_rejected_by_request() -> None:
    """The check runs before any launch, so CPU tensors do on any machine."""
    case = Case([(3, 1), (6, 1)], 4, "cpu", decode=True)
    case.batch.kv_indices[case.batch.kv_indptr[1]] += 1  # request 1's position 0 now sits at offset 1
    with pytest.raises(PageAlignmentError, match="request 1 .*position 0"):
        case.run(TritonBackend(4))


#: compiles every kernel for sm_90 in a process where Triton does not interpret; prints the
#: number of 64-bit integer multiplies in decode stage 1's TTGIR for each index width.
COMPILE_FOR_SM90 = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from reference_impl.attention.triton_ops import decode as dec, extend as ext
ptrs = dict(kv_indptr="*i32", qo_indptr="*i32", prefix_lens="*i32", split_pages="*i32",
            kv_indices="*i64", indices="*i64", packed_rows="*i64")
def build(fn, consts):
    scalar = lambda n: "*fp32" if n[0].isupper() else "fp32" if n == "sm_scale" else "i32"
    sig = {n: "constexpr" if n in consts else ptrs.get(n, scalar(n)) for n in fn.arg_names}
    return triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32))
wide_muls = {}
for int32 in (False, True):
    tiles = dict(HEAD_DIM=16, BLOCK_D=16, BLOCK_N=32, PAGE_SIZE=16, INDEX_INT32=int32)
    ttgir = build(dec._decode_stage1, dict(GROUP=2, BLOCK_R=16, **tiles)).asm["ttgir"]
    wide_muls[str(int32)] = sum("arith.muli" in line and "i64" in line for line in ttgir.splitlines())
    for unified in (False, True):
        build(ext._extend, dict(GROUP=2, BLOCK_M=16, BLOCK_G=2, UNIFIED=unified, **tiles))
build(dec._decode_stage2, dict(NUM_HEADS=4, HEAD_DIM=16, BLOCK_H=4, BLOCK_D=16, PAGE_SIZE=16))
print(json.dumps(wide_muls))
"""


def test_kernels_compile_for_cuda_without_a_gpu() -> None:
    """Every kernel compiles for sm_90 (ptxas included), and INDEX_INT32 leaves no 64-bit multiply in stage 1."""
    wide_muls = json.loads(run_child(COMPILE_FOR_SM90, "a kernel failed to compile", TRITON_INTERPRET="0"))
    assert wide_muls["False"] > 0 and wide_muls["True"] == 0, wide_muls
