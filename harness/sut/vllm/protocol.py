"""The harness's side of ``child.py``'s protocol: a vLLM child in a process group of its own, the requests sent to it
and its answers read back as the oracles read them. A child that dies, hangs up or answers what the protocol does
not allow raises ``EngineChildError`` naming it, with its stderr tail.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.sut.inputs import InputsCheck
from harness.sut.process import LogCursor, ProcessGroup, raised_first
from harness.sut.vllm_common.interpreter import PYTHON_ENV, vllm_python
from reference_impl.request import RequestOutput, RequestSpec

CHILD = Path(__file__).with_name("child.py")
#: the top logprobs asked per step: the top-2 margin tells a tie from a divergence.
TOP_LOGPROBS = 2
#: characters of the child's stderr an error row carries.
STDERR_TAIL = 3000
#: seconds a closing child gets before its process group is killed.
CLOSE_GRACE_S = 10.0


#: how ``ProcessGroup.exited`` words a death by signal (the signal is the error row's type).
_KILLED = re.compile(r"killed by (SIG[A-Z0-9]+)")

class EngineChildError(RuntimeError):
    """The vLLM child died, hung up or answered outside the protocol; the message says which, with its stderr."""


class ChildProcess:
    """``child.py`` in a process group of its own (``ProcessGroup``); every answer read back, or the reason there
    is none. ``name`` says which engine it is in messages (a PD pair has two)."""

    def __init__(self, env: Mapping[str, str], name: str = "vLLM child") -> None:
        python = vllm_python()
        if not python.exists():
            raise EngineChildError(f"no vLLM interpreter at {python} (make vllm-env, or set {PYTHON_ENV})")
        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+", prefix="kvmatrix-vllm-")
        # -I: isolated, so that neither the child's own directory nor $PYTHONPATH puts our modules before vllm's
        self.group = ProcessGroup([str(python), "-I", str(CHILD)], env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.stderr, text=True, grace_s=CLOSE_GRACE_S)
        self.proc = self.group.proc
        self.log = LogCursor(self.stderr.fileno())  # what it logged since the harness last read it

    def ask(self, message: dict) -> dict:
        """Send one request line and read its answer; a refusal from vLLM raises with its traceback."""
        self.send(message)
        return self.receive(str(message["op"]))

    def send(self, message: dict) -> None:
        """Send one request line without waiting for its answer (two engines then start side by side)."""
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._failure(f"the {self.name} is gone ({self._exit()})", self.tail()) from None

    def receive(self, op: str) -> dict:
        """The answer to the request ``op`` sent last."""
        line = self.proc.stdout.readline()
        if not line:
            raise self._failure(f"the {self.name} closed its answers to {op!r} ({self._exit()})", self.tail())
        try:
            answer = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineChildError(f"malformed answer to {op!r} (not JSON: {exc}): {line[:200]!r}") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise EngineChildError(f"malformed answer to {op!r} (no boolean 'ok'): {line[:200]!r}")
        if not answer["ok"]:
            raise self._failure(f"vLLM ({self.name}) refused {op!r}: {answer.get('error')}",
                                str(answer.get("traceback", ""))[-STDERR_TAIL:], "its traceback")
        return answer

    @staticmethod
    def _failure(summary: str, output: str, what: str = "stderr") -> EngineChildError:
        """``summary``, then the child's ``output``, then the cause: that line ends the message, so the error row's
        type is it. A child killed by a signal died of it (``SIGILL``: its output's last traceback is a warning it
        logged while it lived); else the exception the output shows (vLLM's own: a ValidationError, not pydantic's
        footer below it), ``EngineChildError`` when it shows none."""
        killed = _KILLED.search(summary)
        cause = (f"{killed.group(1)}: {summary.splitlines()[0]}" if killed else raised_first(output)
                 or f"EngineChildError: {summary.splitlines()[0]}")
        return EngineChildError(f"{summary}; {what}:\n{output.rstrip()}\n{cause}")

    def _exit(self) -> str:
        return self.group.exited(grace_s=5) or "still running"

    def tail(self) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-STDERR_TAIL:]

    def close(self) -> None:
        """Ask the child to leave, then stop its whole process group (what it left, or all of it after the grace)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=CLOSE_GRACE_S)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.group.stop(grace_s=0.0)
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            stream.close()


#: the speculative counters a serve answer carries, summed per pass; a KV connector's are added beside them.
SPEC_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
#: what the scheduler did in a serve: requests preempted and cached blocks evicted under KV pressure, and the verify
#: steps it padded with placeholder drafts no proposer made, and their tokens (``counts.count_placeholders``).
SCHEDULER_COUNTERS = ("preemptions", "evicted_blocks", "placeholder_drafts", "placeholder_tokens")
#: what the child's pool audit and NaN poison counted in a serve (``audit.py``, ``poison.py``), where they are on:
#: steps audited, problems found, blocks poisoned as the pool handed them out and as requests freed them for good.
INSIDE_COUNTERS = {"audited_steps": ("audit", "steps"), "audit_problems": ("audit", "count"),
                   "poisoned_issued": ("poison", "issued"), "poisoned_freed": ("poison", "freed")}


def start_message(arguments: Mapping[str, object], levels: Mapping[str, object], hold: int = 1) -> dict:
    """The start request of a cell's child: vLLM's arguments, the cell's ``poison`` and ``audit`` levels, and how
    many requests of ``max_model_len`` a tight cache must hold at once (``hold``, vLLM's least raised to)."""
    return {"op": "start", "engine_args": dict(arguments), "poison": levels.get("poison") == "on",
            "audit": levels.get("audit") == "on", "hold": hold}


def audit_problems(answer: Mapping, side: str = "") -> list[str]:
    """The pool audit's problems a serve answer carries (none where the audit is off), each after ``side``."""
    audit = answer.get("audit")
    if audit is None:
        return []
    return [side + str(problem) for problem in field(audit, "problems", list)]


def serve_message(group: Sequence[RequestSpec], *, max_new_tokens: int | None = None,
                  handoff: Sequence[Mapping | None] | None = None) -> dict:
    """A serve request for one round: each request as asked, or with ``max_new_tokens`` and its side of a PD
    handoff (``handoff``, one per request) where a PD pair asks it."""
    requests = []
    for i, r in enumerate(group):
        request = {"rid": r.rid, "prompt": list(r.prompt), "max_new_tokens": max_new_tokens or r.max_new_tokens,
                   "priority": r.priority}
        if handoff is not None:
            request["kv_transfer_params"] = handoff[i]
        requests.append(request)
    return {"op": "serve", "top_logprobs": TOP_LOGPROBS, "requests": requests}


def add_inputs(checks: dict[str, InputsCheck], answer: Mapping, side: str = "") -> None:
    """Add a serve answer's comparison of what ``LLM.generate`` was handed (``inputs``: the child compares them before
    and after the call) to ``checks``, by call (a PD engine's ``side`` named before it)."""
    try:
        check = InputsCheck.from_json(field(answer, "inputs", dict))
    except ValueError as exc:
        raise EngineChildError(f"malformed answer: {exc}") from None
    call = f"{side}{check.call}"
    checks.setdefault(call, InputsCheck(call=call, where=check.where)).add(check.compared, check.changes)


def add_counters(counters: dict[str, int], answer: Mapping, connector: str | None = None) -> None:
    """Add a serve answer's speculative and scheduler counters (preemptions, evicted blocks) and its audit's and
    poison's (``INSIDE_COUNTERS``) to ``counters``, and, named ``connector`` + name, what its KV connector moved (a
    tier's cell: what it loaded)."""
    spec, scheduler = field(answer, "spec", dict), field(answer, "scheduler", dict)
    for name in SPEC_COUNTERS:
        counters[name] = counters.get(name, 0) + int(field(spec, name, int))
    for name in SCHEDULER_COUNTERS:
        if name in scheduler:  # evictions are countable only where the engine core runs in the child
            counters[name] = counters.get(name, 0) + int(field(scheduler, name, int))
    for name, (part, key) in INSIDE_COUNTERS.items():
        if answer.get(part) is not None:
            counters[name] = counters.get(name, 0) + int(field(field(answer, part, dict), key, int))
    if connector is not None:
        for name, value in field(answer, "connector", dict).items():
            counters[connector + name] = counters.get(connector + name, 0) + int(value)


def field(answer: Mapping, name: str, kind: type | tuple[type, ...]) -> object:
    """``answer[name]`` if it is a ``kind``; else the answer is malformed, and the error names the field."""
    value = answer.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise EngineChildError(f"malformed answer: field {name!r} should be {kinds}, got {value!r:.80}")
    return value


def request_output(out: Mapping) -> RequestOutput:
    """One request of a serve answer as the oracles read it (cached tokens all from vLLM's device cache)."""
    top = field(out, "top_logprobs", list)
    cached = int(field(out, "num_cached_tokens", int))
    return RequestOutput(
        rid=str(field(out, "rid", str)), tokens=list(field(out, "tokens", list)),
        logprobs=list(field(out, "logprobs", list)), top_ids=list(field(out, "top_ids", list)), top_logprobs=top,
        margins=[step[0] - step[1] if len(step) > 1 else math.inf for step in top], cached_tokens=cached,
        cached_device=cached, finish_reason=str(field(out, "finish_reason", str)),
    )
