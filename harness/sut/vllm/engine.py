"""vLLM under test: its offline API in a child process of vLLM's own interpreter, one child per cell.

The harness process never imports vllm: ``child.py`` runs under ``.venv-vllm`` (``make vllm-env``;
``$KVMATRIX_VLLM_PYTHON`` names another interpreter, a GPU runner's CUDA vllm say) and answers
line-delimited JSON. A child that dies, hangs past the cell's timeout or answers what the protocol does not
allow is stopped with its whole process group (``harness.sut.process``) and the cell becomes an ``error`` row
carrying the child's stderr tail; nothing outlives the cell, Ctrl-C and a killed harness included. What each
factor maps to: ``arguments``.
"""
from __future__ import annotations

import json
import math
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fixtures.workloads import Workload
from harness.sut.base import CacheTraits, PassResult, SpecTraits, Totals, Traits
from harness.sut.process import ProcessGroup, raised_first
from harness.sut.vllm import LEVELS, PYTHON_ENV, vllm_python
from harness.sut.vllm.arguments import engine_arguments
from reference_impl.request import RequestOutput, RequestSpec

CHILD = Path(__file__).with_name("child.py")
#: the top logprobs asked per step: the top-2 margin tells a tie from a divergence.
TOP_LOGPROBS = 2
#: characters of the child's stderr an error row carries.
STDERR_TAIL = 3000
#: seconds a closing child gets before its process group is killed.
CLOSE_GRACE_S = 10.0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class EngineChildError(RuntimeError):
    """The vLLM child died, hung up or answered outside the protocol; the message says which, with its stderr."""


class ChildProcess:
    """``child.py`` in a process group of its own (``ProcessGroup``); every answer read back, or the reason there
    is none."""

    def __init__(self, env: Mapping[str, str]) -> None:
        python = vllm_python()
        if not python.exists():
            raise EngineChildError(f"no vLLM interpreter at {python} (make vllm-env, or set {PYTHON_ENV})")
        self.stderr = tempfile.TemporaryFile(mode="w+", prefix="kvmatrix-vllm-")
        # -I: isolated, so that neither the child's own directory nor $PYTHONPATH puts our modules before vllm's
        self.group = ProcessGroup([str(python), "-I", str(CHILD)], env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.stderr, text=True, grace_s=CLOSE_GRACE_S)
        self.proc = self.group.proc

    def ask(self, message: dict) -> dict:
        """Send one request line and read its answer; a refusal from vLLM raises with its traceback."""
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._failure(f"the vLLM child is gone ({self._exit()})", self.tail()) from None
        line = self.proc.stdout.readline()
        if not line:
            raise self._failure(f"the vLLM child closed its answers to {message['op']!r} ({self._exit()})", self.tail())
        try:
            answer = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineChildError(f"malformed answer to {message['op']!r} (not JSON: {exc}): {line[:200]!r}") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise EngineChildError(f"malformed answer to {message['op']!r} (no boolean 'ok'): {line[:200]!r}")
        if not answer["ok"]:
            raise self._failure(f"vLLM refused {message['op']!r}: {answer.get('error')}",
                                str(answer.get("traceback", ""))[-STDERR_TAIL:], "its traceback")
        return answer

    @staticmethod
    def _failure(summary: str, output: str, what: str = "stderr") -> EngineChildError:
        """``summary``, then the child's ``output``, then the exception it shows as the cause: that line ends the
        message, so the error row's type is vLLM's own (a ValidationError, not pydantic's footer below it),
        ``EngineChildError`` when it shows none."""
        cause = raised_first(output) or f"EngineChildError: {summary.splitlines()[0]}"
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


class VllmEngine:
    """vLLM for one cell: one child, started at the first workload, its prefix cache emptied for each next one."""

    def __init__(self, levels: Mapping[str, object], faults: frozenset[str], device: str,
                 engine_args: Mapping[str, object]) -> None:
        if faults:
            raise ValueError(f"faults are planted in the reference engine; a vllm cell takes none ({', '.join(faults)})")
        self.levels = LEVELS.full(levels)
        self.arguments = engine_arguments(self.levels, engine_args)
        self.env = {"VLLM_BATCH_INVARIANT": "1"} if self.levels["deterministic"] == "on" else {}
        if device.startswith("cuda"):
            self.env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2] or "0"
        page_size = int(self.levels["page_size"])
        self.traits = Traits(
            dtype=DTYPES[str(self.levels["dtype"])], model=f"vllm-{self.levels['model']}",
            hybrid=self.levels["model"] == "hybrid", deterministic=self.levels["deterministic"] == "on",
            spec=SpecTraits(method=str(self.levels["spec"]), k=int(self.levels["num_draft_tokens"]), pass_counted=True),
            # vLLM keeps a Mamba state at every block boundary (mamba_cache_mode "align"): the snapshot grid is the block
            cache=CacheTraits(enabled=self.levels["cache"] == "device", page_size=page_size, chunk_size=page_size,
                              state_interval=page_size),
            audited=False,
        )
        self.children: dict[bool, ChildProcess] = {}  # alone → its child

    def child(self, alone: bool) -> tuple[ChildProcess, float]:
        """The cell's child (``alone``: a second one running one request at a time), started on first use, and
        the seconds vLLM took to start it now (0 when it was running already)."""
        if alone in self.children:
            self.children[alone].ask({"op": "reset"})
            return self.children[alone], 0.0
        arguments = {**self.arguments, "max_num_seqs": 1} if alone else self.arguments
        child = self.children[alone] = ChildProcess(self.env)
        return child, float(_field(child.ask({"op": "start", "engine_args": arguments}), "seconds", (int, float)))

    def session(self, workload: Workload) -> VllmSession:
        return VllmSession(self)

    def close(self) -> None:
        for child in self.children.values():
            child.close()
        self.children.clear()


class VllmSession:
    """One workload's systems on the cell's child: a cold prefix cache at the first ``open``."""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> VllmSystem:
        if tenant_suffix:
            raise ValueError("vLLM cells have no shared store: no second tenant to open")
        child, start_seconds = self.engine.child(alone)
        return VllmSystem(child, self.engine.traits, start_seconds)

    def close(self) -> None:
        pass


class VllmSystem:
    """The child's engine behind the system-under-test protocol; closing leaves the child to the cell."""

    def __init__(self, child: ChildProcess, traits: Traits, start_seconds: float) -> None:
        self.child = child
        self.traits = traits
        self.seconds = {"start": start_seconds, "requests": 0.0}

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        outputs, counters = [], {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        for group in rounds:
            answer = self.child.ask({"op": "serve", "top_logprobs": TOP_LOGPROBS, "requests": [
                {"rid": r.rid, "prompt": list(r.prompt), "max_new_tokens": r.max_new_tokens, "priority": r.priority}
                for r in group]})
            outputs += [request_output(out) for out in _field(answer, "outputs", list)]
            self.seconds["requests"] += float(_field(answer, "seconds", (int, float)))
            spec = _field(answer, "spec", dict)
            for name in counters:
                counters[name] += int(_field(spec, name, int))
        return PassResult(outputs=outputs, counters=counters)

    def totals(self) -> Totals:
        return Totals(stats={}, seconds=dict(self.seconds))

    def close(self) -> None:
        pass


def _field(answer: Mapping, name: str, kind: type | tuple[type, ...]) -> object:
    """``answer[name]`` if it is a ``kind``; else the answer is malformed, and the error names the field."""
    value = answer.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise EngineChildError(f"malformed answer: field {name!r} should be {kinds}, got {value!r:.80}")
    return value


def request_output(out: Mapping) -> RequestOutput:
    """One request of a serve answer as the oracles read it (cached tokens all from vLLM's device cache)."""
    top = _field(out, "top_logprobs", list)
    cached = int(_field(out, "num_cached_tokens", int))
    return RequestOutput(
        rid=str(_field(out, "rid", str)), tokens=list(_field(out, "tokens", list)),
        logprobs=list(_field(out, "logprobs", list)), top_ids=list(_field(out, "top_ids", list)), top_logprobs=top,
        margins=[step[0] - step[1] if len(step) > 1 else math.inf for step in top], cached_tokens=cached,
        cached_device=cached, finish_reason=str(_field(out, "finish_reason", str)),
    )
