"""The waiting-queue interface (``scheduler = fcfs``, ``priority`` or yours): who is admitted, who is preempted.

A scheduler level names a class built as ``Queue(faults)``; the registry checks it against
``SchedulerQueue`` when a matrix file names it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from reference_impl.engine.scheduler import Admission
from reference_impl.request import Request


class SchedulerQueue(Protocol):
    """The requests waiting for memory; the engine owns them, the queue only orders them.

    Ownership. A queued request holds no page or slot: the engine frees everything before it
    ``push``es a preempted request back. ``admit`` offers requests to the engine's check, which
    takes their memory on ``ADMITTED``; an admitted request leaves the queue, every other one must
    stay in it (dropping one loses a request: the fault ``priority_scheduler_drop``). ``victim``
    only names a running request; the engine preempts it.
    """

    def __len__(self) -> int:
        """Requests waiting."""

    def push(self, req: Request) -> None:
        """Queue a new or preempted request."""

    def admit(self, try_admit: Callable[[Request], Admission]) -> list[Request]:
        """Offer waiting requests in policy order until the check answers FULL; returns those ADMITTED."""

    def victim(self, running: Sequence[Request]) -> Request:
        """The running request to preempt under pool pressure."""
