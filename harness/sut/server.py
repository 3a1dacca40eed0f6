"""Any HTTP inference server under test (``engine = "openai"``): launched from the matrix file's ``[server]``
table, driven over its wire format, stopped by its process group.

A cell's server starts on 127.0.0.1 at a free port, in a process group of its own, its output in a log
file; the harness waits for its health URL, then serves each workload's passes as HTTP requests (token-id
prompts, greedy, exactly the requested tokens, top-2 logprobs; a round's requests in flight together) and
reads back the tokens, logprobs, cached prompt tokens and speculative counters from where the file says
they are. Between workloads the server's cache is emptied (``reset``) or, without a reset URL, the
server is started afresh. A server that exits, never becomes healthy, hangs past the cell's timeout or
answers a field the format does not allow raises ``ServerError`` naming what happened, with the tail of
its output; the cell becomes an ``error`` row. Closing kills the whole process group, whatever happened
(Ctrl-C included): no server outlives its cell.

The wire formats (``API``) are the documented ones: OpenAI completions as vLLM and SGLang serve them
(token ids as ``token_id:N`` strings), llama.cpp's ``/completion`` and SGLang's native ``/generate``.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from fixtures.workloads import Workload
from harness.matrix.levels import OPENAI
from harness.matrix.model import level_token
from harness.matrix.server import placeholders
from harness.sut.base import PassResult, Totals, Traits
from reference_impl.request import RequestOutput, RequestSpec

HOST = "127.0.0.1"
#: the top logprobs asked per step: the top-2 margin tells a tie from a divergence.
TOP_LOGPROBS = 2
#: characters of a server's output an error carries.
LOG_TAIL = 3000
#: seconds a stopping server gets after SIGTERM before its process group is killed.
STOP_GRACE_S = 10.0
#: seconds a request that got no answer waits for the server's death to be reported, to name it.
DEATH_GRACE_S = 2.0
#: seconds between health probes while a server starts.
HEALTH_POLL_S = 0.25
#: where server logs are kept for the report (``harness run`` sets it under its report directory).
LOGS_ENV = "KVMATRIX_SERVER_LOGS"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER_ENV = "KVMATRIX_LLAMA_SERVER"
#: the interpreter SGLang is installed in, on a GPU runner (default: python3)
SGLANG_PYTHON_ENV = "KVMATRIX_SGLANG_PYTHON"
#: what ``make llama-server`` builds (the directory names the Makefile's LLAMA_CPP_PYTHON).
LLAMA_SERVER = ROOT / ".build" / "llama.cpp-0.3.36" / "bin" / "llama-server"


@contextmanager
def logs_kept_under(report_dir: Path) -> Iterator[None]:
    """Keep every server's output under ``report_dir``/servers while the block runs (its cells' metrics name the
    files), unless ``$KVMATRIX_SERVER_LOGS`` already says where; the variable is restored afterwards."""
    if os.environ.get(LOGS_ENV):
        yield
        return
    os.environ[LOGS_ENV] = str(report_dir.resolve() / "servers")
    try:
        yield
    finally:
        os.environ.pop(LOGS_ENV, None)


class ServerError(RuntimeError):
    """The server died, hung, never became healthy, or answered outside its wire format; the message says which."""


# --- reading JSON responses -------------------------------------------------------------------------------

def field_at(doc: object, dotted: str, kind: type | tuple[type, ...], what: str) -> object:
    """``doc`` at the dotted path (``choices.0.logprobs``) if it is a ``kind``; else ``ServerError`` naming the
    field, so a malformed response says exactly what it lacks."""
    value = doc
    for part in dotted.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise ServerError(f"malformed response {what}: no field {dotted!r}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ServerError(f"malformed response {what}: field {dotted!r} should be {names}, got {value!r:.80}")
    return value


def _number_list(doc: object, dotted: str, kind: type, what: str) -> list:
    values = field_at(doc, dotted, list, what)
    for i, value in enumerate(values):
        field_at(values, str(i), kind if kind is int else (int, float), what)
    return list(values)


@dataclass(frozen=True, slots=True)
class Generated:
    """One request's generation as any wire format gives it: the harness's own names."""

    tokens: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    finish_reason: str


# --- wire formats -------------------------------------------------------------------------------------------

def openai_body(request: RequestSpec, top: int, model: str) -> dict:
    """OpenAI completions: a token-id prompt, greedy, ``top`` logprobs (vLLM's and SGLang's extensions fix the
    length: the file's ``request`` adds ``min_tokens``/``ignore_eos``)."""
    return {"model": model, "prompt": list(request.prompt), "max_tokens": request.max_new_tokens, "temperature": 0.0,
            "logprobs": top, "stream": False}


_TOKEN_ID = re.compile(r"token_id:(-?\d+)")


def _token_id(text: str, what: str) -> int:
    match = _TOKEN_ID.fullmatch(text)
    if match is None:
        raise ServerError(f"malformed response {what}: token {text!r:.40} is not 'token_id:N' (start vLLM with "
                          f"--return-tokens-as-token-ids)")
    return int(match.group(1))


def openai_parse(doc: object, what: str) -> Generated:
    choice = field_at(doc, "choices.0", dict, what)
    logprobs = field_at(choice, "logprobs", dict, what)
    tokens = [_token_id(t, what) for t in field_at(logprobs, "tokens", list, what)]
    chosen = _number_list(logprobs, "token_logprobs", float, what)
    steps = field_at(logprobs, "top_logprobs", list, what)
    top_ids, top_lps = [], []
    for i, step in enumerate(steps):
        ranked = sorted(((float(lp), _token_id(t, what)) for t, lp in field_at(steps, str(i), dict, what).items()),
                        key=lambda pair: -pair[0])
        top_ids.append([tid for _, tid in ranked])
        top_lps.append([lp for lp, _ in ranked])
    return Generated(tokens, chosen, top_ids, top_lps, str(field_at(choice, "finish_reason", str, what)))


def llamacpp_body(request: RequestSpec, top: int, model: str) -> dict:
    """llama.cpp's /completion: token ids in and out, greedy, exactly ``n_predict`` tokens, raw top-``top``."""
    return {"prompt": list(request.prompt), "n_predict": request.max_new_tokens, "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "n_probs": top, "post_sampling_probs": False, "return_tokens": True,
            "stream": False}


#: llama.cpp's stop_type → the finish reason the oracles read.
LLAMACPP_FINISH = {"limit": "length", "eos": "stop", "word": "stop", "none": "none"}


def llamacpp_parse(doc: object, what: str) -> Generated:
    tokens = _number_list(doc, "tokens", int, what)
    steps = field_at(doc, "completion_probabilities", list, what)
    chosen, top_ids, top_lps = [], [], []
    for i in range(len(steps)):
        step = field_at(steps, str(i), dict, what)
        chosen.append(float(field_at(step, "logprob", (int, float), what)))
        ranked = field_at(step, "top_logprobs", list, what)
        top_ids.append([int(field_at(ranked, f"{j}.id", int, what)) for j in range(len(ranked))])
        top_lps.append([float(field_at(ranked, f"{j}.logprob", (int, float), what)) for j in range(len(ranked))])
    stop = str(field_at(doc, "stop_type", str, what))
    return Generated(tokens, chosen, top_ids, top_lps, LLAMACPP_FINISH.get(stop, stop))


def sglang_body(request: RequestSpec, top: int, model: str) -> dict:
    """SGLang's native /generate: ``input_ids``, greedy, exactly ``max_new_tokens``, top-``top`` logprobs of the output."""
    n = request.max_new_tokens
    return {"input_ids": list(request.prompt), "return_logprob": True, "top_logprobs_num": top,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "min_new_tokens": n, "ignore_eos": True}}


def sglang_parse(doc: object, what: str) -> Generated:
    tokens = _number_list(doc, "output_ids", int, what)
    chosen_steps = field_at(doc, "meta_info.output_token_logprobs", list, what)
    chosen = [float(field_at(chosen_steps, f"{i}.0", (int, float), what)) for i in range(len(chosen_steps))]
    steps = field_at(doc, "meta_info.output_top_logprobs", list, what)
    top_ids, top_lps = [], []
    for i in range(len(steps)):
        ranked = field_at(steps, str(i), list, what)
        top_lps.append([float(field_at(ranked, f"{j}.0", (int, float), what)) for j in range(len(ranked))])
        top_ids.append([int(field_at(ranked, f"{j}.1", int, what)) for j in range(len(ranked))])
    return Generated(tokens, chosen, top_ids, top_lps, str(field_at(doc, "meta_info.finish_reason.type", str, what)))


@dataclass(frozen=True, slots=True)
class Api:
    """A wire format: the request body for one request, and the generation read back from its response."""

    body: Callable[[RequestSpec, int, str], dict]
    parse: Callable[[object, str], Generated]


API: Mapping[str, Api] = {
    "openai": Api(openai_body, openai_parse),
    "llamacpp": Api(llamacpp_body, llamacpp_parse),
    "sglang": Api(sglang_body, sglang_parse),
}


def request_output(server: Mapping, request: RequestSpec, doc: object,
                   counted: bool = True) -> tuple[RequestOutput, dict[str, int]]:
    """One response read through the server's format: the output the oracles judge, and its per-request
    counters (``counted``: a cell with a proposer, whose responses must carry them)."""
    what = f"to request {request.rid!r}"
    gen = API[server["api"]].parse(doc, what)
    for name, values in (("logprobs", gen.logprobs), ("top_logprobs", gen.top_logprobs)):
        if len(values) != len(gen.tokens):
            raise ServerError(f"malformed response {what}: {len(gen.tokens)} tokens but {len(values)} {name}")
    cached = int(field_at(doc, server["cached_tokens"], int, what))
    counters = {name: int(field_at(doc, where, int, what))
                for name, (kind, where) in server["counters"].items() if kind == "response" and counted}
    return RequestOutput(
        rid=request.rid, tokens=gen.tokens, logprobs=gen.logprobs, top_ids=gen.top_ids,
        top_logprobs=gen.top_logprobs, margins=[s[0] - s[1] if len(s) > 1 else math.inf for s in gen.top_logprobs],
        cached_tokens=cached, cached_device=cached, finish_reason=gen.finish_reason,
    ), counters


def pass_counters(counters: dict[str, int], outputs: Sequence[RequestOutput]) -> dict[str, int]:
    """A pass's speculative counters as the accept_length oracle reads them. Verify steps alone are SGLang's
    accounting (accept length = generated tokens / verify steps): drafts = steps, accepted = generated - steps."""
    if "verify_steps" not in counters:
        return counters
    steps = counters["verify_steps"]
    rest = {name: value for name, value in counters.items() if name != "verify_steps"}
    return {**rest, "drafts": steps, "accepted_tokens": sum(len(o.tokens) for o in outputs) - steps}


# --- Prometheus -----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_sums(text: str) -> dict[str, float]:
    """A Prometheus text exposition's samples, summed over label sets by metric name."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            raise ServerError(f"malformed metrics: {line[:120]!r} has no number") from None
        sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


# --- launching ------------------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def llama_server_path() -> Path:
    """Where the llama-server binary is looked for: ``$KVMATRIX_LLAMA_SERVER``, else what ``make llama-server`` builds."""
    return Path(os.environ.get(LLAMA_SERVER_ENV) or LLAMA_SERVER)


def llama_server() -> Path:
    """The llama-server binary; ``ServerError`` naming the make target when it is not there."""
    path = llama_server_path()
    if not path.is_file():
        raise ServerError(f"no llama-server at {path} (make llama-server, or set {LLAMA_SERVER_ENV})")
    return path


def artefact(name: str, levels: Mapping[str, object]) -> str:
    """What a ``PLACEHOLDERS`` name stands for in this cell, made on first use."""
    from harness.sut.checkpoints import checkpoint_dir

    if name == "checkpoint":
        return str(checkpoint_dir(str(levels["model"])))
    if name in ("draft_checkpoint", "eagle_checkpoint", "sglang_eagle_checkpoint"):
        return str(checkpoint_dir(name.removesuffix("_checkpoint")))
    if name in ("gguf", "draft_gguf"):
        from harness.sut.gguf_export import gguf_file

        return str(gguf_file(str(levels["model"]) if name == "gguf" else "draft"))
    if name == "vllm_python":
        from harness.sut.vllm import vllm_python

        return str(vllm_python())
    if name == "sglang_python":
        return os.environ.get(SGLANG_PYTHON_ENV) or "python3"
    if name == "llama_server":
        return str(llama_server())
    if name == "root":
        return str(ROOT)
    raise KeyError(name)


def launch_problem(server: Mapping) -> str | None:
    """Why the server's program cannot start here (not built, not installed), or None: found at load, a matrix
    that cannot run is refused instead of run into error cells."""
    program = server["command"][0]
    names = set(placeholders(program))
    if names - set(PROGRAMS):
        return None  # a program named by the cell's levels: known only per cell
    try:
        path = program.format(**{name: artefact(name, {}) for name in names})
    except ServerError as exc:
        return str(exc)
    if shutil.which(path) is None:
        hint = " (make vllm-env, or set KVMATRIX_VLLM_PYTHON)" if "vllm_python" in names else ""
        return f"no program {path!r} (from {program!r}){hint}"
    return None


#: placeholders that name a program, resolved without building anything.
PROGRAMS = ("vllm_python", "sglang_python", "llama_server", "root")


class Launch:
    """A cell's launch rendered: argv, environment and request fields, from its levels and port."""

    def __init__(self, server: Mapping, levels: Mapping[str, object], port: int) -> None:
        values: dict[str, object] = {"host": HOST, "port": port, **levels}
        cache: dict[str, str] = {}

        def render(text: str, level: object = None) -> str:
            for name in set(placeholders(text)) - values.keys() - {"level"} - cache.keys():
                cache[name] = artefact(name, levels)
            return text.format(**{**values, **cache, "level": level})

        entries = [(server["levels"][factor][str(level)], level) for factor, level in levels.items()
                   if factor in server["levels"]]
        self.argv = [render(part) for part in server["command"]]
        self.env = {name: render(text) for name, text in server["env"].items()}
        self.request = dict(server["request"])
        for entry, level in entries:
            self.argv += [render(part, level) for part in entry["flags"]]
            self.env.update({name: render(text, level) for name, text in entry["env"].items()})
            self.request.update(entry["request"])


#: a Python exception line in a server's output (``TypeError: 'function' object is not subscriptable``).
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception): .{1,300})")
#: what the lines just above a traceback's last line look like (its frames, its carets).
_FRAME = re.compile(r'File "|\^\^\^|Traceback \(most recent call last\)')


def raised_first(text: str) -> str | None:
    """The exception a server's output shows as the cause: the first that ends a traceback (later ones are
    usually its consequences: vLLM's EngineDeadError says 'see above'), else the last exception line it
    printed (a warning may quote one), else None."""
    lines = text.splitlines()
    found = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _EXCEPTION.search(line))]
    ending = [exc for i, exc in found if any(_FRAME.search(line) for line in lines[max(i - 3, 0):i])]
    return ending[0] if ending else found[-1][1] if found else None


class ServerProcess:
    """One server in a process group of its own, its output in a log file; stopped group and all."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.log = log_path.open("w+")
        self.served_from = 0  # the size of its output (bytes) when it became healthy
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=self.log,
                                         stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env})
        except OSError as exc:
            self.log.close()
            raise ServerError(f"cannot launch {argv[0]!r}: {exc}") from exc

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def failure(self, summary: str) -> ServerError:
        """``summary``, then the server's output tail, then its last exception line (often far above the tail):
        that line ends the message, so the error row's type is the server's own (``error: TypeError`` is
        declarable), ``ServerError`` when it printed none."""
        self.log.flush()
        output = self.log_path.read_bytes()
        # once it served, what it printed while starting (vLLM logs a warning's traceback there) is not the cause
        cause = raised_first(output[self.served_from:].decode(errors="replace")) or f"ServerError: {summary}"
        tail = output[-LOG_TAIL:].decode(errors="replace").rstrip()
        return ServerError(f"{summary}; its output ({self.log_path}):\n{tail}\n{cause}")

    def exited(self, grace_s: float = 0.0) -> str | None:
        """How the server ended (``exit 1``, ``killed by SIGSEGV``), None while it runs (after waiting up to
        ``grace_s`` for it to end: a dropped connection comes before the kernel reports the death behind it)."""
        try:
            code = self.proc.wait(timeout=grace_s) if grace_s else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return None
        return f"exit {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"

    def wait_healthy(self, health: str, timeout_s: float) -> float:
        """Seconds until ``health`` answers 200; ``ServerError`` if the server exits first or never does."""
        began = time.perf_counter()
        while True:
            ended = self.exited()
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

    def call(self, path: str, body: dict | None, timeout_s: float, what: str) -> object:
        """POST ``body`` (GET without one) and the JSON answer; ``ServerError`` for anything else."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(path), data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise self.failure(f"{path} answered HTTP {exc.code} {what}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            state = self.exited(grace_s=DEATH_GRACE_S) or "running"
            raise self.failure(f"{path} gave no answer {what} ({exc}; server {state})") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerError(f"malformed response {what}: not JSON: {raw[:200]!r}") from None

    def text(self, path: str, timeout_s: float) -> str:
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout_s) as answer:
                return answer.read().decode(errors="replace")
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            state = self.exited(grace_s=DEATH_GRACE_S) or "running"
            raise self.failure(f"{path} gave no answer ({exc}; server {state})") from None

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to what is left after the grace; on return no process of the group runs
        (SIGKILL is delivered asynchronously: the group is watched until it is gone)."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=STOP_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + STOP_GRACE_S
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.proc.wait()
        self.log.close()


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


# --- the system-under-test protocol ----------------------------------------------------------------------------

def server_traits(server: Mapping, levels: Mapping[str, object]) -> Traits:
    """What the oracles know of a server cell, from the levels they read (``OPENAI``'s factors)."""
    return Traits(
        dtype=DTYPES[str(levels["dtype"])], cache_enabled=levels["cache"] != "off",
        hybrid=levels["model"] == "hybrid", deterministic=levels["deterministic"] == "on",
        page_size=int(levels["page_size"]), num_draft_tokens=int(levels["num_draft_tokens"]),
        chunk_size=int(levels["page_size"]), state_interval=int(levels["page_size"]),
        spec=str(levels["spec"]), model=f"{server['name']}-{levels['model']}", audited=False, pass_counted=True,
    )


class ServerEngine:
    """A server for one cell: started at the first workload, its cache emptied (or itself restarted) for each next."""

    def __init__(self, levels: Mapping[str, object], faults: frozenset[str], device: str,
                 server: Mapping[str, object]) -> None:
        if faults:
            raise ValueError(f"faults are planted in the reference engine; a server cell takes none ({', '.join(faults)})")
        self.server = server
        self.levels = OPENAI.full(levels)
        self.traits = server_traits(server, self.levels)
        self.timeout_s = float(server["start_timeout_s"])
        self.process: ServerProcess | None = None
        self.served = False  # the running server has served a workload: empty its cache before the next
        self.starts = 0
        self._tmp: tempfile.TemporaryDirectory | None = None
        logs = os.environ.get(LOGS_ENV)
        self.keeps_logs = bool(logs)
        if logs:
            self.log_dir = Path(logs)
            self.log_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="kvmatrix-server-")
            self.log_dir = Path(self._tmp.name)
        ident = json.dumps({"levels": self.levels, "server": server}, sort_keys=True, default=str)
        self.log_stem = f"{level_token(server['name'])}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"

    def running(self) -> tuple[ServerProcess, float]:
        """The cell's server, healthy and with an empty cache (started now, reset, or restarted), and the
        seconds it took to start now (0 when it was running already)."""
        if self.process is not None and self.served:
            if self.server["reset"] is None:
                self._stop()
            else:
                self.process.call(self.server["reset"], {}, self.timeout_s, "to the cache reset")
        started = 0.0
        if self.process is None:
            port = free_port()
            self.launch = Launch(self.server, self.levels, port)
            self.starts += 1
            self.process = ServerProcess(self.launch.argv, self.launch.env, port,
                                         self.log_dir / f"{self.log_stem}-{self.starts}.log")
            started = self.process.wait_healthy(self.server["health"], self.timeout_s)
        self.served = True
        return self.process, started

    def session(self, workload: Workload) -> ServerSession:
        return ServerSession(self)

    def _stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def close(self) -> None:
        self._stop()
        if self._tmp is not None:
            self._tmp.cleanup()


class ServerSession:
    """One workload on the cell's server: a cold cache at the first ``open``; ``alone`` sends one request at a time."""

    def __init__(self, engine: ServerEngine) -> None:
        self.engine = engine
        self.opened = False

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> ServerSystem:
        if tenant_suffix:
            raise ValueError("a server cell has no shared store: no second tenant to open")
        process, started = self.engine.running() if not self.opened or alone else (self.engine.process, 0.0)
        self.opened = True
        return ServerSystem(self.engine, process, alone, started)

    def close(self) -> None:
        pass


class ServerSystem:
    """The running server behind the system-under-test protocol; closing leaves the server to the cell."""

    def __init__(self, engine: ServerEngine, process: ServerProcess, alone: bool, start_seconds: float) -> None:
        self.engine = engine
        self.process = process
        self.alone = alone
        self.traits = engine.traits
        self.seconds = {"start": start_seconds, "requests": 0.0}

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        server = self.engine.server
        # a server without a proposer may not export its speculative metrics at all; with one, each must be there
        counted = server["counters"] if self.traits.spec != "none" else {}
        metric_names = {name: where for name, (kind, where) in counted.items() if kind == "metric"}
        before = self._metrics() if metric_names else {}
        outputs: list[RequestOutput] = []
        counters = {name: 0 for name in counted}
        began = time.perf_counter()
        for group in rounds:
            for batch in ([[r] for r in group] if self.alone else [list(group)]):
                for output, per_request in self._together(batch):
                    outputs.append(output)
                    for name in counters.keys() & per_request.keys():
                        counters[name] += per_request[name]
        self.seconds["requests"] += time.perf_counter() - began
        if metric_names:
            after = self._metrics()
            for name, metric in metric_names.items():
                if metric not in after:
                    raise ServerError(f"malformed metrics: {server['metrics']} has no {metric!r}")
                counters[name] = int(round(after[metric] - before.get(metric, 0.0)))
        return PassResult(outputs=outputs, counters=pass_counters(counters, outputs))

    def _together(self, batch: list[RequestSpec]) -> list[tuple[RequestOutput, dict[str, int]]]:
        """``batch``'s requests in flight at once, answers in request order. On a timeout or Ctrl-C the threads are
        left to end with the server's sockets when the cell stops it, never waited on here."""
        pool = ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="kvmatrix-request")
        try:
            return list(pool.map(self._one, batch))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, request: RequestSpec) -> tuple[RequestOutput, dict[str, int]]:
        server, launch = self.engine.server, self.engine.launch
        body = {**API[server["api"]].body(request, TOP_LOGPROBS, server["model_name"]), **launch.request}
        if server["priority"] is not None:
            body[server["priority"]] = request.priority
        doc = self.process.call(server["endpoint"], body, self.engine.timeout_s, f"to request {request.rid!r}")
        return request_output(server, request, doc, counted=self.traits.spec != "none")

    def _metrics(self) -> dict[str, float]:
        return metric_sums(self.process.text(self.engine.server["metrics"], self.engine.timeout_s))

    def totals(self) -> Totals:
        kept = [str(self.process.log_path)] if self.engine.keeps_logs else []
        return Totals(stats={}, seconds=dict(self.seconds), logs=kept)

    def close(self) -> None:
        pass
