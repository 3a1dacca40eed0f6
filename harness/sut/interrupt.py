"""How the harness stops on a signal: SIGINT, SIGTERM and SIGHUP all become one ``Interrupted`` in the main thread.

``Interrupted`` is a ``KeyboardInterrupt``, so every path that already unwinds on Ctrl-C (a cell's engine closed,
its process groups stopped, the row store finished, the workers stopped) unwinds on a ``kill`` or a hang-up too,
and the command exits ``128 + signal`` (130, 143, 129). It is raised once: a second signal while the harness
unwinds is noted, not raised, so the cleanup that stops every process is never cut short (a watchdog still stops a
process group whose starter is killed outright: ``harness.sut.process``). ``uninterrupted`` holds a signal back
(and a cell's deadline: ``harness.run.serve``) while a process group is being started or stopped, so none is ever
left half-started or half-stopped.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: the signals a run stops on, as Ctrl-C: the terminal's interrupt, ``kill``/``timeout``/a CI cancel, a hang-up.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The harness was told to stop by ``signum``; the exit status is ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signum_of(exc: KeyboardInterrupt) -> int:
    """The signal behind a ``KeyboardInterrupt``: its own for ``Interrupted``, SIGINT for Python's Ctrl-C."""
    return exc.signum if isinstance(exc, Interrupted) else signal.SIGINT


class _State:
    """The main thread's interrupt state while ``stop_on_signals`` holds (signal handlers run in the main thread)."""

    held = 0                  # ``uninterrupted`` blocks entered and not left
    pending: int | None = None  # a signal that came while held
    raised = False            # Interrupted was raised: later signals are only noted


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_signal(signum: int, frame: object) -> None:
    if _State.raised:
        return
    if _State.held:
        _State.pending = _State.pending or signum
        return
    _State.raised = True
    raise Interrupted(signum)


@contextmanager
def stop_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Raise ``Interrupted`` in the main thread on the first of ``signals``; the previous handlers come back
    afterwards. SIGINT is heard even when the process started ignoring it (a script's background job does, not
    by choice); any other signal the process started ignoring stays ignored (``nohup`` ignores SIGHUP on purpose).
    Elsewhere than the main thread nothing changes (Python runs handlers there only)."""
    if not _main_thread():
        yield
        return
    heard = [s for s in signals if s == signal.SIGINT or signal.getsignal(s) is not signal.SIG_IGN]
    previous = {signum: signal.signal(signum, _on_signal) for signum in heard}
    _State.held, _State.pending, _State.raised = 0, None, False
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def holding() -> bool:
    """Whether an ``uninterrupted`` block runs now (a cell's deadline waits for it too: harness.run.serve)."""
    return _State.held > 0


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold a stop signal back until the block ends, then raise it: what the block starts or stops is done whole."""
    if not _main_thread():
        yield
        return
    _State.held += 1
    try:
        yield
    finally:
        _State.held -= 1
        if not _State.held and _State.pending is not None and not _State.raised:
            signum, _State.pending = _State.pending, None
            _State.raised = True
            raise Interrupted(signum)
