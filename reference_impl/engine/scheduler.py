"""Waiting-queue policies: who is admitted next, who may pass a blocked request, who is preempted.

Each offers ``engine.queue.SchedulerQueue``.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from enum import Enum

from reference_impl.faults import PRIORITY_SCHEDULER_DROP
from reference_impl.request import Request


class Admission(Enum):
    """Answer of the engine's admission check for one request."""

    ADMITTED = "admitted"
    BLOCKED = "blocked"   # does not fit the pool now; a later request might
    FULL = "full"         # the step's token budget or running limit is spent: stop admitting


AdmitFn = Callable[[Request], Admission]


class FcfsQueue:
    """First come, first served, with head-of-line blocking (vLLM's default FCFS policy)."""

    name = "fcfs"

    def __init__(self, faults: frozenset[str] = frozenset()) -> None:
        self._queue: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, req: Request) -> None:
        """Queue a new or preempted request; arrival order decides its place."""
        index = next((i for i, other in enumerate(self._queue) if other.arrival > req.arrival), len(self._queue))
        self._queue.insert(index, req)

    def admit(self, try_admit: AdmitFn) -> list[Request]:
        """Admit from the head until one does not fit."""
        admitted = []
        while self._queue and try_admit(self._queue[0]) is Admission.ADMITTED:
            admitted.append(self._queue.popleft())
        return admitted

    def victim(self, running: Sequence[Request]) -> Request:
        """The request to preempt under pool pressure: the latest arrival."""
        return max(running, key=lambda r: r.arrival)


class PriorityQueue:
    """Lowest priority value first, then arrival; a request that does not fit may be passed."""

    name = "priority"

    def __init__(self, faults: frozenset[str] = frozenset()) -> None:
        self._heap: list[tuple[int, int, Request]] = []
        self._drop_passed = PRIORITY_SCHEDULER_DROP.name in faults

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival, req))

    def admit(self, try_admit: AdmitFn) -> list[Request]:
        """Admit in priority order; requests passed over for not fitting go back in the queue."""
        admitted, passed = [], []
        while self._heap:
            req = heapq.heappop(self._heap)[2]
            verdict = try_admit(req)
            if verdict is Admission.ADMITTED:
                admitted.append(req)
            elif verdict is Admission.BLOCKED:
                passed.append(req)
            else:
                self.push(req)
                break
        if not self._drop_passed:  # fault priority_scheduler_drop: forget the passed-over requests
            for req in passed:
                self.push(req)
        return admitted

    def victim(self, running: Sequence[Request]) -> Request:
        """Preempt the least urgent request: highest priority value, then latest arrival."""
        return max(running, key=lambda r: (r.priority, r.arrival))
