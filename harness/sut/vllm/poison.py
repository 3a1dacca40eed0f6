"""NaN poison for vLLM's KV cache, inside the vLLM child (``poison = on``): SGLang's ``SGLANG_DEBUG_POISON_POOL``
(#33974) for vLLM's block pool, so a read of KV bytes nobody wrote for the reading request is a NaN the ``nan``,
``tokens`` and ``logprobs`` oracles see, deterministically, instead of whatever the block last held.

Runs in vLLM's interpreter (``child.py`` loads it by path): the standard library, torch and vllm only.

Every KV cache tensor the worker allocated (each attention layer's keys and values, the proposer's layers, a Mamba
layer's conv and SSM states) is filled with NaN once the engine is built; after that a block is filled again

- when the block pool hands it out anew (``BlockPool.get_new_blocks``: a free block, or a cached one it evicts), in
  the scheduler, before the step that writes it runs: what a request reads of a block it was just given and did not
  write is NaN, and so is what a KV connector (NIXL's read on a PD decode side, the disk tier's load) was to write
  there and did not;
- when a request frees it for good (``BlockPool.free_blocks`` leaves it unheld and uncached): a later read through a
  stale block table is NaN. A freed block that keeps a prefix-cache hash is still the cache's, readable by a hit,
  and is poisoned when it is evicted.

What is written: 0xFF in every byte, a NaN in every float type a vLLM KV cache holds (fp32, bf16, fp16, fp8 e4m3fn
and e5m2: all exponent bits set, a non-zero mantissa), since a hybrid model's attention and Mamba layers view one
buffer under different dtypes (vLLM pads their pages to one size and shares the block pool): a pattern of one dtype
would read as a finite number through another view. Except in one place, by vLLM's own rule: the values of an
attention block of vLLM's CPU backend are zeroed, not poisoned, and its keys carry the NaN. Its kernel
(``csrc/cpu/cpu_attn_impl.hpp``, ``AttentionMainLoop``) reads whole 16- or 32-token tiles past a sequence's end,
masks their logits by assignment (-inf, so a NaN key there vanishes) and multiplies the tile's values by their zero
probabilities (0 x NaN = NaN): it relies on a block's unwritten slots holding finite bytes, which vLLM keeps true by
design (a KV cache allocated as zeros, only finite KV written to it, and new blocks zeroed where another view may
have left other bytes: ``KVCacheConfig.needs_kv_cache_zeroing``). With every byte NaN each pass reads NaN from its
first step (seen on the EAGLE head, 48 of 48 logprobs). A NaN key still reaches every read of an unwritten slot the
mask does not hide. What vLLM zeroes by its own rule stays zero: a hybrid model's new attention blocks, zeroed before
their first forward (#35219, ``CPUModelRunner._zero_block_ids``) after the fill here.
"""
from __future__ import annotations

from typing import Any

#: the byte every poisoned KV byte holds (as the signed integer of its width, -1): a NaN in fp32, bf16, fp16, fp8
#: e4m3fn and fp8 e5m2 alike. A CPU attention block's values hold 0 (the module's rule).
POISON, ZERO = -1, 0


def kv_tensors(worker: Any) -> list[tuple[str, int, Any]]:
    """Every KV cache tensor of the worker's layers as (layer, the fill, the tensor), from the forward context vLLM
    binds them in, the proposer's layers included: a CPU attention layer's keys (poison) and values (zero) as the
    backend views them (``[blocks, kv heads, 2 x block size, head size]``, keys first: ``cpu_attn.py``), any other
    attention layer's whole tensor and a Mamba layer's conv and SSM states (poison), attention first: where a hybrid
    model's views share bytes, the states' poison is written last. Run through ``collective_rpc``: the uni executor
    returns the tensors themselves."""
    import torch

    attention, states = [], []
    for name, layer in sorted(worker.model_runner.compilation_config.static_forward_context.items()):
        cache = getattr(layer, "kv_cache", None)
        if isinstance(cache, (list, tuple)):
            states += [(name, POISON, t) for t in cache if isinstance(t, torch.Tensor) and t.numel()]
        elif isinstance(cache, torch.Tensor) and type(getattr(layer, "impl", None)).__name__ == "CPUAttentionBackendImpl":
            blocks, heads, block_size, _ = cache.shape
            halves = cache.view(blocks, heads, 2 * block_size, -1)
            attention += [(name, POISON, halves[:, :, :block_size]), (name, ZERO, halves[:, :, block_size:])]
        elif isinstance(cache, torch.Tensor) and cache.numel():
            attention.append((name, POISON, cache))
    return attention + states


def _bits(tensor: Any) -> Any:
    """``tensor`` viewed as the signed integer of its width (any strides): -1 writes 0xFF to every byte."""
    import torch

    return tensor.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


class KvPoison:
    """The engine's KV cache poisoned at start and on every block's re-issue and final free (the module's rules).
    ``counts`` says how many blocks were poisoned each way since the last ``take``."""

    def __init__(self, llm: Any) -> None:
        core = llm.llm_engine.engine_core.engine_core  # AttributeError where the engine core is another process
        self.pool = core.scheduler.kv_cache_manager.block_pool
        self.num_blocks = int(core.scheduler.kv_cache_config.num_blocks)
        self.tensors = []  # (layer, the fill, its integer view, kernel blocks per pool block)
        for name, fill, tensor in llm.collective_rpc(kv_tensors)[0]:
            if tensor.shape[0] % self.num_blocks:
                raise ValueError(f"poison: layer {name}'s KV tensor {tuple(tensor.shape)} has no block dimension of "
                                 f"{self.num_blocks} blocks")
            self.tensors.append((name, fill, _bits(tensor), tensor.shape[0] // self.num_blocks))
        self.counts = {"issued": 0, "freed": 0}
        for _, fill, bits, _ in self.tensors:
            bits.fill_(fill)
        self._wrap()

    def describe(self) -> dict:
        """What was poisoned at start: each layer's tensors (shape and dtype) and the bytes in all."""
        layers: dict[str, list[str]] = {}
        for name, fill, bits, _ in self.tensors:
            layers.setdefault(name, []).append(f"{'NaN' if fill == POISON else 'zero'} {list(bits.shape)}x"
                                               f"{bits.element_size()}B")
        return {"layers": layers, "bytes": sum(b.numel() * b.element_size() for _, f, b, _ in self.tensors if f == POISON),
                "blocks": self.num_blocks}

    def fill(self, block_ids: list[int]) -> None:
        """Poison ``block_ids`` in every layer's tensors."""
        if not block_ids:
            return
        import torch

        index = torch.tensor(block_ids, dtype=torch.long)
        for _, fill, bits, ratio in self.tensors:
            rows = index if ratio == 1 else (index[:, None] * ratio + torch.arange(ratio)).flatten()
            bits.index_fill_(0, rows, fill)

    def take(self) -> dict:
        """The blocks poisoned since the last call, on issue and on free."""
        counts, self.counts = self.counts, {"issued": 0, "freed": 0}
        return counts

    def _wrap(self) -> None:
        """Poison each block ``get_new_blocks`` hands out, and each one ``free_blocks`` leaves unheld and uncached."""
        pool, issue, free = self.pool, self.pool.get_new_blocks, self.pool.free_blocks

        def get_new_blocks(num_blocks: int) -> list:
            blocks = issue(num_blocks)
            self.fill([b.block_id for b in blocks])
            self.counts["issued"] += len(blocks)
            return blocks

        def free_blocks(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            free(blocks)
            gone = [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null and b.pool in (None, pool)
                    and (b.block_hash is None or not pool.enable_caching)]
            self.fill(gone)
            self.counts["freed"] += len(gone)

        pool.get_new_blocks, pool.free_blocks = get_new_blocks, free_blocks
