"""User-style components plugged in by import path in test matrices (``tests.components:Name``)."""
from __future__ import annotations

import time

from reference_impl.engine.scheduler import FcfsQueue


class ExplodingQueue(FcfsQueue):
    """A scheduler that crashes on first use: its cell must become an ``error``, not stop the run."""

    def admit(self, try_admit):
        raise RuntimeError("queue exploded")


class SlowQueue(FcfsQueue):
    """A scheduler that hangs: its cell must hit the matrix timeout."""

    def admit(self, try_admit):
        time.sleep(60)
        return super().admit(try_admit)
