"""The one owner of every process the harness starts (a vLLM child, a server, a PD pair's engines): each in a
process group of its own, tied to the life of the process that started it, stopped group and all.

Tied by a watchdog, not by ``PR_SET_PDEATHSIG``: the death signal reaches only the direct child (a vLLM
server's engine-core child or a llama-server's workers would be left) and fires when the *thread* that
forked exits. The watchdog is a ``/bin/sh`` in a session of its own that blocks reading a pipe whose only
writer is the process that started the group; when that process ends in any way (SIGKILL and the OOM
killer included) the pipe reads end of file and the watchdog sends the whole group SIGTERM, then SIGKILL
after the grace. A normal ``stop`` stops the group itself and dismisses its watchdog first, so a reused
group id is never signalled.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

#: seconds a stopping group gets after SIGTERM before it is killed.
STOP_GRACE_S = 10.0
#: where processes keep their output for the report (``harness run`` sets it under its report directory).
LOGS_ENV = "KVMATRIX_SERVER_LOGS"
#: ``$0`` the group id, ``$1`` the grace: waits for end of file on stdin, then stops the group.
_WATCHDOG = 'read -r _ ; kill -TERM -$0 2>/dev/null ; sleep $1 ; kill -KILL -$0 2>/dev/null'


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


class ProcessGroup:
    """``argv`` started in a process group (and session) of its own, watched by a watchdog; ``stop`` ends the
    whole group. Raises ``OSError`` when ``argv`` cannot be started."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, stdin: int | IO = subprocess.DEVNULL,
                 stdout: int | IO = subprocess.DEVNULL, stderr: int | IO = subprocess.STDOUT, text: bool = False,
                 grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self.proc = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr, text=text,
                                     start_new_session=True, env={**os.environ, **env})
        self.watchdog = subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, str(self.proc.pid), f"{grace_s:g}"],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)

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
        self._dismiss_watchdog()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + max(grace, 1.0)
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        self.proc.wait()

    def _dismiss_watchdog(self) -> None:
        if self.watchdog.poll() is None:
            self.watchdog.kill()
        self.watchdog.wait()
        self.watchdog.stdin.close()
