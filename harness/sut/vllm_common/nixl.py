"""What vLLM's NIXL connector moves into a PD pair's decode side, by its own rule: the pd_audit oracle judges the
bytes by it, and a reproducer script copies it in (the standard library alone, no import)."""
from __future__ import annotations

from collections.abc import Sequence

#: what vLLM's NIXL connector logs of each failure it counts (``NixlConnectorWorker._log_failure``, at ERROR: its
#: type, a transfer state or the exception, and the request's context).
FAILURE = "NIXL transfer failure: "


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


def failure_lines(log: str) -> list[str]:
    """vLLM's own account of each NIXL failure in an engine's ``log`` (``FAILURE``): the line from its marker on, and,
    where a traceback follows it, the exception that ends the traceback (vLLM's formatter repeats a record's header
    on each of its lines: it is taken off)."""
    lines, found = log.splitlines(), []
    for i, line in enumerate(lines):
        at = line.find(FAILURE)
        if at < 0:
            continue
        header, said = line[:at], line[at:]
        after = [rest[len(header):] if rest.startswith(header) else rest for rest in lines[i + 1:]]
        if after and after[0].startswith("Traceback"):
            ending = next((rest for rest in after[1:] if rest and not rest[0].isspace()), "")
            said += f" <- {ending}" if ending else ""
        found.append(said)
    return found
