"""What vLLM's NIXL connector moves into a PD pair's decode side, by its own rule: the pd_audit oracle judges the
bytes by it, and a reproducer script copies it in (the standard library alone, no import)."""
from __future__ import annotations

from collections.abc import Sequence


def nixl_bytes(prompts: Sequence[int], backoff: int, hit: int, block_size: int, block_bytes: int,
               state_bytes: int, states: int | None = None) -> tuple[int, str]:
    """The bytes NIXL must move into the decode side for prompts of these lengths, and why: every prompt's blocks but
    the ``backoff`` tokens the decode side computes, less its own ``hit`` (tokens), × the bytes a block holds in every
    KV cache group, and the state of each request read (``states``; None: every request). Built-ins alone:
    reproducer scripts copy it in."""
    states = len(prompts) if states is None else states
    blocks = sum(-(-(n - backoff) // block_size) for n in prompts) - hit // block_size
    why = (f"{blocks} block(s) past the decode side's hit × {block_bytes} B + {states} request state(s) × "
           f"{state_bytes} B")
    return blocks * block_bytes + states * state_bytes, why
