"""One NIXL agent per side, set up the way a 2-core CPU machine needs (see README, PD disaggregation).

UCX backend over loopback, DRAM only, no progress thread (it would take half a core): a write
reaches DONE only while both sides poll, so every wait here polls. The NIXL package is optional:
``NixlUnavailable`` names how to install it when it is missing.
"""
from __future__ import annotations

import os

import numpy as np

#: how the wheel is installed next to the CPU torch (the plain requirement pulls a CUDA torch)
INSTALL_HINT = "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 (make installs it)"


class NixlUnavailable(RuntimeError):
    """The nixl package is not installed (or its UCX backend did not load)."""


def make_agent(name: str) -> object:
    """A NIXL agent with the UCX backend on loopback and no progress thread."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")  # its INFO lines go to stdout, into the harness's progress
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as exc:
        raise NixlUnavailable(f"pd = nixl needs the nixl package: {INSTALL_HINT} ({exc})") from exc
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    if "UCX" not in agent.backends:
        raise NixlUnavailable(f"NIXL's UCX backend did not load (plugins: {agent.plugin_list})")
    return agent


def register(agent: object, addresses: list[tuple[int, int]]) -> None:
    """Register each (address, bytes) region with the agent, once."""
    regions = [(addr, size, 0, "") for addr, size in addresses if size]
    if regions:
        agent.register_memory(regions, "DRAM")


def descriptors(bases: list[int], blocks: list[tuple[int, int, int]]) -> np.ndarray:
    """Nx3 (address, bytes, device 0) descriptors of (region, offset, bytes) blocks."""
    table = np.asarray(blocks, dtype=np.uint64).reshape(-1, 3)
    out = np.zeros_like(table)
    out[:, 0] = np.asarray(bases, dtype=np.uint64)[table[:, 0]] + table[:, 1]
    out[:, 1] = table[:, 2]
    return out
