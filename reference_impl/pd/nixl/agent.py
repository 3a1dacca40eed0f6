"""One NIXL agent per side, set up the way a 2-core CPU machine needs (see README, PD disaggregation).

UCX backend over loopback, DRAM only, no progress thread (it would take half a core): a write
reaches DONE only while both sides poll, so every wait here polls. The NIXL package is optional:
``NixlUnavailable`` names how to install it when it is missing.
"""
from __future__ import annotations

import os
import time

import numpy as np

from reference_impl.pd.handoff import TransportError

# NIXL logs INFO lines to stdout (into the harness's progress line) unless told otherwise before its
# first import; importing this module is enough.
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
#: how the wheel is installed next to the CPU torch (the plain requirement pulls a CUDA torch)
INSTALL_HINT = "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 (make installs it)"
#: seconds a wait may take for its write's notification
NOTIF_TIMEOUT_S = 60.0


class NixlUnavailable(RuntimeError):
    """The nixl package is not installed (or its UCX backend did not load)."""


class NixlEndpoint:
    """A NIXL agent with the UCX backend on loopback, no progress thread, and its registered memory."""

    def __init__(self, name: str) -> None:
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError as exc:
            raise NixlUnavailable(f"pd = nixl needs the nixl package: {INSTALL_HINT} ({exc})") from exc
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        if "UCX" not in self.agent.backends:
            raise NixlUnavailable(f"NIXL's UCX backend did not load (plugins: {self.agent.plugin_list})")
        self.peer = ""

    def register(self, addresses: list[tuple[int, int]]) -> bytes:
        """Register each (address, bytes) region once; returns this agent's metadata for the peer."""
        regions = [(addr, size, 0, "") for addr, size in addresses if size]
        if regions:
            self.agent.register_memory(regions, "DRAM")
        return self.agent.get_agent_metadata()

    def meet(self, metadata: bytes) -> None:
        peer = self.agent.add_remote_agent(metadata)
        self.peer = peer.decode() if isinstance(peer, bytes) else peer  # notifications are keyed by str

    def wait(self, tag: bytes) -> None:
        """Poll until the write tagged ``tag`` has landed (no progress thread: polling is what moves it)."""
        deadline = time.monotonic() + NOTIF_TIMEOUT_S
        while not self.agent.check_remote_xfer_done(self.peer, tag):
            if time.monotonic() > deadline:
                raise TransportError(f"no NIXL notification {tag!r} from {self.peer} in {NOTIF_TIMEOUT_S:g} s")


def descriptors(bases: list[int], blocks: list[tuple[int, int, int]]) -> np.ndarray:
    """Nx3 (address, bytes, device 0) descriptors of (region, offset, bytes) blocks."""
    table = np.asarray(blocks, dtype=np.uint64).reshape(-1, 3)
    out = np.zeros_like(table)
    out[:, 0] = np.asarray(bases, dtype=np.uint64)[table[:, 0]] + table[:, 1]
    out[:, 1] = table[:, 2]
    return out
