"""A running server: its process group (``harness.sut.process``), its health, its HTTP calls, and the cause an
error names (the server's own first exception, read from its log).
"""
from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.sut.openai.launch import HOST
from harness.sut.openai.wire import ServerError
from harness.sut.process import LogCursor, ProcessGroup, raised_first

#: characters of a server's output an error carries.
LOG_TAIL = 3000
#: seconds a request that got no answer waits for the server's death to be reported, to name it.
DEATH_GRACE_S = 2.0
#: seconds between health probes while a server starts.
HEALTH_POLL_S = 0.25


#: signals a process dies of by a fault of its own (an illegal instruction, a bad address, abort()), not a kill sent
FAULT_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT, signal.SIGTRAP,
                           signal.SIGSYS})


class ServerProcess:
    """One server in a process group of its own, its output in a log file; stopped group and all."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.log = log_path.open("w+")
        self.served_from = 0  # the size of its output (bytes) when it became healthy
        self.cursor = LogCursor(self.log.fileno())  # what it printed since the harness last read it
        try:
            self.group = ProcessGroup(argv, env, stdout=self.log)
        except OSError as exc:
            self.log.close()
            raise ServerError(f"cannot launch {argv[0]!r}: {exc}") from exc

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def failure(self, summary: str) -> ServerError:
        """``summary``, then the server's output tail, then its cause: the fault signal that killed it (``SIGILL: …``),
        else its last exception line (often far above the tail), else the signal that ended it. That line ends the
        message, so the error row's type is the fault or the server's own exception (``error: SIGILL``,
        ``error: TypeError`` are declarable), ``ServerError`` when it printed none."""
        self.log.flush()
        output = self.log_path.read_bytes()
        code = self.group.proc.poll()
        killed = signal.Signals(-code) if code is not None and code < 0 else None
        # once it served, what it printed while starting (vLLM logs a warning's traceback there) is not the cause
        raised = raised_first(output[self.served_from:].decode(errors="replace"))
        # a kill after an exception is the server ending itself (SGLang's launcher SIGKILLs its own process tree
        # once a child dies: kill_process_tree); a fault is the CPU's or the process's own, whatever it printed
        if killed is not None and (killed in FAULT_SIGNALS or raised is None):
            cause = f"{killed.name}: the server was killed by a signal"
        else:
            cause = raised or f"ServerError: {summary}"
        tail = output[-LOG_TAIL:].decode(errors="replace").rstrip()
        return ServerError(f"{summary}; its output ({self.log_path}):\n{tail}\n{cause}")

    def wait_healthy(self, health: str, timeout_s: float) -> float:
        """Seconds until ``health`` answers 200; ``ServerError`` if the server exits first or never does."""
        began = time.perf_counter()
        while True:
            ended = self.group.exited()
            if ended is not None:
                raise self.failure(f"the server ended ({ended}) before {health} answered")
            try:
                with urllib.request.urlopen(self.url(health), timeout=2.0) as answer:
                    if answer.status == 200:
                        self.served_from = self.log_path.stat().st_size
                        return time.perf_counter() - began
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            if time.perf_counter() - began > timeout_s:
                raise self.failure(f"the server did not answer {health} within {timeout_s:g} s")
            time.sleep(HEALTH_POLL_S)

    def call(self, path: str, body: dict | None, timeout_s: float, what: str, text_ok: bool = False) -> object:
        """POST ``body`` (GET without one) and the JSON answer (or, with ``text_ok``, the text of an answer that is
        not JSON); ``ServerError`` for anything else."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(path), data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise self.failure(f"{path} answered HTTP {exc.code} {what}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            state = self.group.exited(grace_s=DEATH_GRACE_S) or "running"
            raise self.failure(f"{path} gave no answer {what} ({exc}; server {state})") from None
        try:
            return json.loads(raw)
        except ValueError:
            if text_ok:
                return raw.decode(errors="replace")
            raise ServerError(f"malformed response {what}: not JSON: {raw[:200]!r}") from None

    def text(self, path: str, timeout_s: float) -> str:
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout_s) as answer:
                return answer.read().decode(errors="replace")
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            state = self.group.exited(grace_s=DEATH_GRACE_S) or "running"
            raise self.failure(f"{path} gave no answer ({exc}; server {state})") from None

    def stop(self) -> None:
        """Stop the server's whole process group (``ProcessGroup.stop``) and close its log."""
        self.group.stop()
        self.log.close()
