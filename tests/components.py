"""User-style components plugged in by import path in test matrices (``tests.components:Name``)."""
from __future__ import annotations

import os
import signal
import time

from reference_impl.engine.scheduler import FcfsQueue
from reference_impl.memory.pool import Pool
from reference_impl.memory.static import StaticPools
from reference_impl.registry import protocol_members


class ExplodingQueue(FcfsQueue):
    """A scheduler that crashes on first use: its cell must become an ``error``, not stop the run."""

    def admit(self, try_admit):
        raise RuntimeError("queue exploded")


class SlowQueue(FcfsQueue):
    """A scheduler that hangs: its cell must hit the matrix timeout."""

    def admit(self, try_admit):
        time.sleep(60)
        return super().admit(try_admit)


class DyingQueue(FcfsQueue):
    """A scheduler whose process dies on first use (as in a segfault or the OOM killer): a worker that dies."""

    def admit(self, try_admit):
        os.kill(os.getpid(), signal.SIGKILL)


class DeafQueue(FcfsQueue):
    """A scheduler that hangs with the timeout's alarm blocked (as in a C call that never returns)."""

    def admit(self, try_admit):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)


#: the environment variable naming GatedQueue's gate file.
GATE_ENV = "KVMATRIX_TEST_GATE"


class GatedQueue(FcfsQueue):
    """A scheduler that holds its cell while the file named by ``$KVMATRIX_TEST_GATE`` exists (at most 300 s):
    a cell certain to be still running when a test interrupts the run."""

    def admit(self, try_admit):
        gate, waited = os.environ.get(GATE_ENV), 0.0
        while gate and os.path.exists(gate) and waited < 300:
            time.sleep(0.05)
            waited += 0.05
        return super().admit(try_admit)


class CountingPool(StaticPools):
    """A user pool that counts its page allocations: a correct plug-in, every Pool member inherited."""

    def alloc_pages(self, n: int) -> list[int] | None:
        self.allocations = getattr(self, "allocations", 0) + 1
        return super().alloc_pages(n)


#: a user pool whose author forgot ``free_pages``: every other member of the Pool interface, taken from StaticPools.
BrokenPool = type("BrokenPool", (), {
    name: vars(StaticPools)[name] for name in protocol_members(Pool) if name != "free_pages"
})
