"""Cells side by side in worker processes (``harness run -j N``), with the same results as one after another.

Golden runs first: the parent collects the golden runs (golden levels × workload) that the cells
will read, has the workers compute each one once, keeps them, and hands every cell task the ones
it reads; a cell never computes a golden run itself. Then the cells, dearest first (their
``[cost]``) so that a long Triton cell does not start last; ``on_result`` hears each as it ends,
and ``ResultsStore.finish`` puts the run's rows back in cell order.

Workers are forked from a forkserver that imported torch, triton and the harness once, each with
one torch thread; they are not daemons, so a PD ``nixl`` cell can still start its decode child
(through a forkserver of the worker's own). A worker that dies (a segfault, the OOM killer) turns
the cell it held into an ``error`` row and is replaced; a cell past its timeout raises in the
worker (as in a serial run), and a worker that does not return within ``KILL_GRACE_S`` after that
is killed and its cell becomes ``error``.

Stopping: workers ignore Ctrl-C, which the parent handles (as SIGTERM and SIGHUP: harness.sut.interrupt). The
parent stops its workers with SIGTERM, which a worker hears as ``Interrupted``: its cell unwinds, closing its
engine and stopping the process groups it started; the parent waits for that (``WORKER_STOP_S``) before it
kills a worker that has not ended, whose groups its watchdogs then stop. Every finished cell is already in
results.jsonl (``--resume`` goes on from there). A worker whose parent is gone (killed) stops the same way.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from harness import oracles, sut
from harness.results.rows import CellResult
from harness.run.cell import configure_torch, run_plan
from harness.run.golden import GoldenRuns
from harness.run.plan import CellPlan
from harness.run.row import error_result
from harness.run.serve import deadline
from harness.sut.interrupt import stop_on_signals
from harness.sut.process import STOP_GRACE_S, is_live, stop_all

#: seconds a worker may overrun its cell's timeout (the in-worker alarm fires first) before it is killed.
KILL_GRACE_S = 30.0
#: how often a worker checks that its parent is alive.
PARENT_POLL_S = 1.0
#: seconds a stopped worker gets to close its engine (each of its process groups gets ``STOP_GRACE_S``) before it is
#: killed.
WORKER_STOP_S = STOP_GRACE_S + 5.0

OnStep = Callable[[int, str], None]
OnResult = Callable[[int, CellResult], None]


def default_jobs() -> int:
    """Worker processes by default: the cores this process may run on."""
    return len(os.sched_getaffinity(0))


@dataclass(slots=True)
class _Task:
    """One unit of work for a worker: a golden run (``index`` into the golden keys) or a cell (into the plans)."""

    kind: str  # "golden" | "cell"
    index: int
    message: tuple
    timeout_s: float


def execute(plans: Sequence[CellPlan], goldens: GoldenRuns, *, jobs: int, on_step: OnStep, on_result: OnResult,
            order: Sequence[int] | None = None) -> None:
    """Run every plan, in-process when ``jobs`` is 1, else in ``jobs`` workers; ``on_result(i, result)`` per cell.

    ``order``: the plan indices in the order to start them (default: as given).
    """
    order = list(order) if order is not None else list(range(len(plans)))
    if jobs <= 1:
        for i in order:
            on_step(i, "starting")
            on_result(i, run_plan(plans[i], goldens, lambda what, i=i: on_step(i, what)))
        return
    _Pool(jobs, goldens.device).run(plans, goldens, order, on_step, on_result)


def _worker(conn: Connection, parent_pid: int, plugins: Sequence[str]) -> None:
    """A worker's life: the parent's plugins, one torch thread, Ctrl-C left to the parent, tasks until told to stop
    (``None``, or SIGTERM: the cell it runs unwinds and its process groups stop) or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with stop_on_signals((signal.SIGTERM, signal.SIGHUP)):
        for module in plugins:  # oracles and engines registered in the parent register here again on import
            importlib.import_module(module)
        configure_torch()
        threading.Thread(target=_stop_when_orphaned, args=(parent_pid,), daemon=True).start()
        try:
            _take_tasks(conn)
        except KeyboardInterrupt:
            pass  # stopped: nobody reads an answer now
        finally:
            stop_all()  # a group an interrupt caught as it started, before its engine held it


def _take_tasks(conn: Connection) -> None:
    """Run each task the parent sends and send back its outcome, until it sends ``None``."""
    while True:
        message = conn.recv()
        if message is None:
            return
        kind, *args = message
        send_step = lambda what: conn.send(("step", what))  # noqa: E731
        if kind == "golden":
            key, device, timeout_s = args
            conn.send(("done", _golden(key, device, timeout_s)))
        else:
            plan, runs, device = args
            goldens = GoldenRuns(device)
            for key, run in runs.items():
                goldens.put(key, run)
            conn.send(("done", run_plan(plan, goldens, send_step)))


def _golden(key: tuple, device: str, timeout_s: float) -> object:
    """A golden run, or the traceback that stopped it (the cells that need it become ``error`` rows)."""
    try:
        with deadline(timeout_s):
            return GoldenRuns.compute(key, device)
    except Exception as exc:
        return "".join(traceback.format_exception(exc)).strip()


def _stop_when_orphaned(parent_pid: int) -> None:
    """Stop this worker as its parent would once the parent is gone (a zombie parent is gone too): SIGTERM to itself,
    then, if that did not end it, exit."""
    while is_live(parent_pid):
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(WORKER_STOP_S)
    os._exit(1)


class _Slot:
    """The parent's handle on one worker process and the task it holds."""

    def __init__(self, ctx: multiprocessing.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe()
        plugins = [*oracles.plugin_modules(), *sut.plugin_modules()]
        self.process = ctx.Process(target=_worker, args=(child, os.getpid(), plugins), daemon=False)
        self.process.start()
        child.close()
        self.task: _Task | None = None
        self.started = 0.0

    def give(self, task: _Task) -> None:
        self.task, self.started = task, time.monotonic()
        self.conn.send(task.message)

    def overdue(self) -> bool:
        return self.task is not None and time.monotonic() - self.started > self.task.timeout_s + KILL_GRACE_S

    def kill(self) -> None:
        """SIGKILL a worker that died or does not answer (the watchdogs of the groups it started stop them)."""
        self.process.kill()
        self.join(time.monotonic())

    def ask_to_stop(self) -> None:
        """An idle worker leaves; a busy one hears SIGTERM, unwinds its cell and stops the groups it started."""
        try:
            if self.task is None:
                self.conn.send(None)
            else:
                os.kill(self.process.pid, signal.SIGTERM)
        except (OSError, ValueError):  # gone already
            pass

    def join(self, deadline: float) -> None:
        """Wait for the worker to end until ``deadline`` (monotonic), then kill it; its pipe is closed."""
        self.process.join(max(deadline - time.monotonic(), 0.0))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class _Pool:
    """``jobs`` worker processes fed one task at a time: the golden runs first, then the cells."""

    def __init__(self, jobs: int, device: str) -> None:
        self.jobs = jobs
        self.device = device
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["harness.run.parallel"])
        self.slots: list[_Slot] = []

    def run(self, plans: Sequence[CellPlan], goldens: GoldenRuns, order: Sequence[int], on_step: OnStep,
            on_result: OnResult) -> None:
        keys = list(dict.fromkeys(k for i in order for k in plans[i].golden_keys() if k not in goldens))
        lookups = sum(len(plans[i].golden_keys()) for i in order)
        try:
            failed = self._goldens(keys, plans, order, goldens)
            cells = []
            for i in order:
                broken = next((failed[k] for k in plans[i].golden_keys() if k in failed), None)
                if broken is not None:
                    on_result(i, error_result(plans[i].result(), f"golden run failed:\n{broken}", 0.0))
                else:
                    needed = plans[i].golden_keys()
                    cells.append(_Task("cell", i, ("cell", plans[i], goldens.runs(needed), self.device), plans[i].timeout_s))
            self._drain(cells, lambda task, outcome: on_result(task.index, _cell_outcome(plans[task.index], outcome)),
                        lambda task, what: on_step(task.index, what))
        finally:  # done, or interrupted: every worker stopped, busy ones unwinding their cells side by side
            for slot in self.slots:
                slot.ask_to_stop()
            stopped_by = time.monotonic() + WORKER_STOP_S
            for slot in self.slots:
                slot.join(stopped_by)
            self.slots.clear()
        goldens.reused += lookups - len(keys)

    def _goldens(self, keys: list[tuple], plans: Sequence[CellPlan], order: Sequence[int],
                 goldens: GoldenRuns) -> dict[tuple, str]:
        """Compute each golden run once, in the workers; return the keys that failed, with why."""
        timeout = max((plans[i].timeout_s for i in order), default=0.0)
        tasks = [_Task("golden", n, ("golden", key, self.device, timeout), timeout) for n, key in enumerate(keys)]
        failed: dict[tuple, str] = {}

        def done(task: _Task, outcome: object) -> None:
            if isinstance(outcome, (str, _Died)):
                failed[keys[task.index]] = outcome if isinstance(outcome, str) else outcome.why
            else:
                goldens.put(keys[task.index], outcome)

        self._drain(tasks, done, lambda task, what: None)
        return failed

    def _drain(self, tasks: list[_Task], done: Callable[[_Task, object], None],
               step: Callable[[_Task, str], None]) -> None:
        """Hand ``tasks`` out in order, one per idle worker, until every one has an outcome."""
        pending = list(reversed(tasks))
        while pending or any(slot.task for slot in self.slots):
            self._fill(pending)
            busy = [slot for slot in self.slots if slot.task]
            ready = wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout=1.0)
            for slot in busy:
                task = slot.task
                if slot.conn in ready:
                    try:
                        kind, payload = slot.conn.recv()
                    except (EOFError, OSError):
                        kind, payload = "died", None
                    if kind == "step":
                        step(task, payload)
                        continue
                    if kind == "done":
                        slot.task = None
                        done(task, payload)
                        continue
                if slot.process.sentinel in ready or slot.overdue():
                    why = (f"killed: still running {KILL_GRACE_S:g} s past its timeout of {task.timeout_s:g} s"
                           if slot.process.is_alive() else f"worker process died (exit code {slot.process.exitcode})")
                    slot.kill()
                    self.slots.remove(slot)
                    done(task, _Died(why))

    def _fill(self, pending: list[_Task]) -> None:
        """Give a task to every idle worker, starting workers (up to ``jobs``) as needed."""
        for slot in [s for s in self.slots if s.task is None and not s.process.is_alive()]:
            slot.kill()  # died between tasks: replaced below
            self.slots.remove(slot)
        for slot in self.slots:
            if slot.task is None and pending:
                slot.give(pending.pop())
        while pending and len(self.slots) < self.jobs:
            self.slots.append(_Slot(self.ctx))
            self.slots[-1].give(pending.pop())


@dataclass(frozen=True, slots=True)
class _Died:
    """A task whose worker died or was killed: why."""

    why: str


def _cell_outcome(plan: CellPlan, outcome: object) -> CellResult:
    """A worker's CellResult as it is, or the ``error`` row of a cell whose worker died or was killed."""
    if isinstance(outcome, _Died):
        return error_result(plan.result(), f"{outcome.why} while running this cell", 0.0)
    return outcome
