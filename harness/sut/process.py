"""The one owner of every process the harness starts (a vLLM child, a server, a PD pair's engines): each in a
process group of its own, tied to the life of the process that started it, stopped group and all.

Tied by a watchdog, not by ``PR_SET_PDEATHSIG``: the death signal reaches only the direct child (a vLLM
server's engine-core child or a llama-server's workers would be left) and fires when the *thread* that
forked exits. The watchdog is a ``/bin/sh`` in a session of its own that blocks reading a pipe whose only
writer is the process that started the group (the pipe is close-on-exec, and nothing here forks without
exec); when that process ends in any way (SIGKILL and the OOM killer included) the pipe reads end of file and
the watchdog sends the whole group SIGTERM, then SIGKILL once the grace is over, and leaves as soon as the group
is gone. The leader starts behind a gate (a ``/bin/sh`` that reads one line of its stdin, then execs ``argv`` under its
own pid): the line is sent once the watchdog runs, and a starter killed before that (SIGKILL cannot be held) closes
the pipe, so the gate exits and ``argv`` never runs unwatched. A normal ``stop`` stops the group itself, then dismisses the watchdog (SIGKILL: it signals nothing) before
the leader is reaped, so a reused group id is never signalled; a stop signal waits until a start or a stop is done
(``harness.sut.interrupt.uninterrupted``), so no group is left half-started or half-stopped. Every group started
and not yet stopped is listed here too: ``stop_all`` stops those that an interrupt left without an owner (one that
came just as a group started, before its engine held it).
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from harness.sut.interrupt import uninterrupted

#: seconds a stopping group gets after SIGTERM before it is killed.
STOP_GRACE_S = 10.0
#: where processes keep their output for the report (``harness run`` sets it under its report directory).
LOGS_ENV = "KVMATRIX_SERVER_LOGS"
#: ``$0`` the group id, ``$1`` the grace in tenths of a second: waits for end of file on stdin, then stops the
#: group, and leaves as soon as no process of it is left.
_WATCHDOG = ('read -r _ ; kill -TERM -$0 2>/dev/null ; n=0 ; '
             'while kill -0 -$0 2>/dev/null && [ $n -lt $1 ] ; do sleep 0.1 ; n=$((n+1)) ; done ; '
             'kill -KILL -$0 2>/dev/null')

#: ``$@`` the command: waits for the line ``go`` on stdin (``read`` takes a pipe byte by byte: what follows is the
#: command's), then becomes the command (same pid, so the same group id); end of file first (the starter died
#: before its watchdog ran) ends it without running the command. ``{stdin}``: the command's own stdin, if not this.
_GATE = 'IFS= read -r word ; [ "$word" = go ] || exit 125 ; exec "$@" {stdin}'


@contextmanager
def logs_kept_under(report_dir: Path) -> Iterator[None]:
    """Keep every started process's output under ``report_dir``/servers while the block runs (its cells' metrics
    name the files), unless ``$KVMATRIX_SERVER_LOGS`` already says where; the variable is restored afterwards."""
    if os.environ.get(LOGS_ENV):
        yield
        return
    os.environ[LOGS_ENV] = str(report_dir.resolve() / "servers")
    try:
        yield
    finally:
        os.environ.pop(LOGS_ENV, None)


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (state, ppid, pgrp, …); None for a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_live(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie has ended (an orphan's zombie may never be reaped where init does
    not reap)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """The live processes of group ``pgid`` (a server's workers may outlive its leader)."""
    pids = (int(path.name) for path in Path("/proc").glob("[0-9]*"))
    return [pid for pid in pids if (fields := _stat(pid)) and fields[0] != "Z" and int(fields[2]) == pgid]


def ended(code: int | None) -> str | None:
    """A return code as a person reads it (``exit 1``, ``killed by SIGSEGV``); None while running."""
    if code is None:
        return None
    return f"exit {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"


#: every group started here and not stopped yet, owned or not
_STARTED: set[ProcessGroup] = set()


def stop_all() -> None:
    """Stop every group started by this process and not stopped yet (after an interrupt: what no engine closed)."""
    for group in list(_STARTED):
        group.stop()


#: a Python exception line in a process's output (``TypeError: 'function' object is not subscriptable``).
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception): .{1,300})")
#: what the lines just above a traceback's last line look like (its frames, its carets).
_FRAME = re.compile(r'File "|\^\^\^|Traceback \(most recent call last\)')


def raised_first(text: str) -> str | None:
    """The exception a process's output shows as the cause (an error that ends with it takes its type:
    ``harness.results.rows.error_type`` reads the last line): the first that ends a traceback (later ones are
    usually its consequences: vLLM's EngineDeadError says 'see above'), else the last exception line it
    printed (a warning may quote one), else None."""
    lines = text.splitlines()
    found = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _EXCEPTION.search(line))]
    ending = [exc for i, exc in found if any(_FRAME.search(line) for line in lines[max(i - 3, 0):i])]
    return ending[0] if ending else found[-1][1] if found else None


class LogCursor:
    """What a process wrote to its log file (``fd``, open on it) since the last ``new``, read by offset: the file is
    the process's, written through its own descriptor, so the reader keeps only a position."""

    def __init__(self, fd: int) -> None:
        self.fd, self.offset = fd, 0

    def new(self) -> str:
        end = os.fstat(self.fd).st_size
        data = os.pread(self.fd, max(end - self.offset, 0), self.offset)
        self.offset += len(data)
        return data.decode(errors="replace")


class ProcessGroup:
    """``argv`` started in a process group (and session) of its own, watched by a watchdog; ``stop`` ends the
    whole group. Raises ``OSError`` when ``argv`` cannot be started."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, stdin: int = subprocess.DEVNULL,
                 stdout: int | IO = subprocess.DEVNULL, stderr: int | IO = subprocess.STDOUT, text: bool = False,
                 grace_s: float = STOP_GRACE_S) -> None:
        """``stdin``: ``subprocess.DEVNULL``, or ``subprocess.PIPE`` for a child that reads requests there."""
        if stdin not in (subprocess.DEVNULL, subprocess.PIPE):
            raise ValueError(f"stdin must be DEVNULL or PIPE, not {stdin!r}")
        self.grace_s = grace_s
        _check_runnable(argv[0], env.get("PATH", os.environ.get("PATH", os.defpath)))
        gate = _GATE.format(stdin="</dev/null" if stdin == subprocess.DEVNULL else "")
        with uninterrupted():
            self.proc = subprocess.Popen(["/bin/sh", "-c", gate, "gate", *argv], stdin=subprocess.PIPE,
                                         stdout=stdout, stderr=stderr, text=text, start_new_session=True,
                                         env={**os.environ, **env})
            try:
                self.watchdog = subprocess.Popen(
                    ["/bin/sh", "-c", _WATCHDOG, str(self.proc.pid), str(max(1, round(grace_s * 10)))],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True)
            except OSError:
                self.proc.stdin.close()  # the gate reads end of file and ends: argv never ran
                self.proc.wait()
                raise
            self.proc.stdin.write("go\n" if text else b"go\n")
            self.proc.stdin.flush()
            if stdin == subprocess.DEVNULL:
                self.proc.stdin.close()
            _STARTED.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self, grace_s: float = 0.0) -> str | None:
        """How the leader ended (``exit 1``, ``killed by SIGSEGV``), None while it runs (after waiting up to
        ``grace_s`` for it to end: a dropped connection comes before the kernel reports the death behind it)."""
        try:
            code = self.proc.wait(timeout=grace_s) if grace_s else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        return ended(code)

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM to the group, SIGKILL to what is left after the grace; on return no process of the group runs
        (SIGKILL is delivered asynchronously: the group is watched until it is gone), and the watchdog is gone."""
        grace = self.grace_s if grace_s is None else grace_s
        if self not in _STARTED:
            return  # stopped already: its group id may be another's now
        with uninterrupted():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            _wait_gone(self.proc.pid, grace)
            deadline = time.monotonic() + max(grace, 1.0)
            while group_members(self.proc.pid) and time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.05)
            if self.watchdog.poll() is None:
                self.watchdog.kill()
            self.watchdog.wait()
            self.watchdog.stdin.close()
            self.proc.wait()  # the leader's zombie held its pid (the group id) until now
            _STARTED.discard(self)


def _check_runnable(program: str, path: str) -> None:
    """Raise the ``OSError`` that exec would for ``program`` (the gate execs it only after the start returned)."""
    if shutil.which(program, path=path):
        return
    code = errno.EACCES if os.sep in program and os.path.exists(program) else errno.ENOENT
    raise OSError(code, os.strerror(code), program)


def _wait_gone(pgid: int, seconds: float) -> None:
    """Wait up to ``seconds`` for group ``pgid`` to have no live member (a zombie leader is not one)."""
    deadline = time.monotonic() + seconds
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
