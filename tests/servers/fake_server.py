"""A stand-in inference server for tests/harness/sut/openai/test_engine.py: OpenAI completions over HTTP, and every way to fail.

``python fake_server.py PORT MODE PIDFILE``. Its tokens are a fixed function of the prompt (so its golden
runs agree with its cells); MODE makes it misbehave: ``ok``; ``exit`` (exits before it is healthy); ``sigill`` (killed
by SIGILL before it is healthy, having printed an exception line, as llama.cpp's AMX kernel dies in its warm-up);
``self_kill`` (prints a traceback, then SIGKILLs itself before it is healthy, as SGLang's launcher ends its process
tree once its scheduler dies);
``unhealthy`` (never answers 200 on /health); ``die:N`` (killed by SIGKILL at its N-th completion);
``hang:N`` (never answers its N-th completion); ``not_json``; ``drop:FIELD`` (a response without FIELD, a
dotted path); ``child`` (forks a worker that must die with it, as a real server's engine process); ``slow:S``
(forks such a worker and answers every completion after S seconds); ``late:S`` (answers its first completion
after S seconds); ``stuck_reset`` (its cache reset answers ``{"success": false}``, as vLLM's while blocks are held);
``text_reset`` (its cache reset answers in plain text, as SGLang's /flush_cache).
A ``--role=prefill`` or ``--role=decode`` argument makes it one side of a PD pair: the prefill side answers
``kv_transfer_params`` naming the prompt it computed (``stale_handoff``: the one before it), the decode side
computes its tokens from the prompt the parameters name, as a decode engine reads the KV it was handed.
With ``KVMATRIX_FAKE_MEET=N`` in its environment, every server but the first to start (a run's golden server) holds
its completions until N have started, once and for 20 s at most: a lifecycle test's -j 2 run, whose signal must find
both workers serving, does not rely on two servers' start-ups overlapping on a loaded machine.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE, PIDS = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ORDER = 0  # this server's place among those started with PIDS (main)
ROLE = next((arg.partition("=")[2] for arg in sys.argv if arg.startswith("--role=")), None)
MEET = int(os.environ.get("KVMATRIX_FAKE_MEET", "0"))
MEET_S = 20
met = False  # this server has met the others, or stopped waiting
completions = 0
prefilled: list[list[int]] = []  # the prompts the prefill side computed, in order


def record_pid() -> None:
    with open(PIDS, "a") as out:
        out.write(f"{os.getpid()}\n")


def started() -> int:
    """How many servers have started with this PIDS file (this one included, once it has recorded itself)."""
    path = Path(PIDS + ".started")
    return len(path.read_text().splitlines()) if path.exists() else 0


def meet(order: int) -> None:
    """Hold a server that started after the first until MEET servers have started, once and for MEET_S at most (a
    run whose other cell never starts a server, its worker killed first, still ends)."""
    global met
    deadline = time.monotonic() + MEET_S
    while not met and order > 1 and started() < MEET and time.monotonic() < deadline:
        time.sleep(0.05)
    met = True


def tokens_for(prompt: list[int], n: int) -> list[int]:
    out, state = [], sum(prompt)
    for _ in range(n):
        state = (state * 31 + 7) % 97
        out.append(state)
    return out


def completion(body: dict) -> dict:
    prompt = body["prompt"]
    if ROLE == "decode":  # the KV it reads is the prompt the handoff names
        prompt = body["kv_transfer_params"]["prompt"]
    tokens = tokens_for(prompt, body["max_tokens"])
    doc = {"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": [-0.5] * len(tokens),
        "top_logprobs": [{f"token_id:{t}": -0.5, f"token_id:{t + 1}": -2.0} for t in tokens]}}],
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(tokens),
                  "prompt_tokens_details": {"cached_tokens": 0}}}
    if ROLE == "prefill" and body.get("kv_transfer_params", {}).get("do_remote_decode"):
        prefilled.append(prompt)
        doc["kv_transfer_params"] = {"prompt": prefilled[-2 if MODE == "stale_handoff" and len(prefilled) > 1 else -1]}
    if MODE.startswith("drop:"):
        *parents, last = MODE.partition(":")[2].split(".")
        holder = doc
        for part in parents:
            holder = holder[int(part)] if part.isdigit() else holder[part]
        holder.pop(last, None)
    return doc


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("fake server: " + format % args + "\n")

    def answer(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.answer(503 if MODE == "unhealthy" else 200, b"{}")
        elif self.path == "/metrics":
            self.answer(200, f"fake:drafts_total{{model=\"m\"}} {completions}\n".encode())
        else:
            self.answer(404, b"{}")

    def do_POST(self) -> None:
        global completions
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/reset":
            if MODE == "text_reset":  # SGLang's /flush_cache: plain text, HTTP 200
                self.answer(200, b"Cache flushed.\nPlease check backend logs for more details.\n")
            else:
                self.answer(200, json.dumps({"success": MODE != "stuck_reset"}).encode())
            return
        completions += 1
        meet(ORDER)
        n = int(MODE.partition(":")[2]) if MODE.startswith(("die:", "hang:")) else 0
        if MODE.startswith("die:") and completions >= n:
            sys.stderr.write("fake server: out of memory\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if MODE.startswith("hang:") and completions >= n:
            Path(PIDS + ".hanging").touch()  # a test that stops the harness mid-pass waits for this
            time.sleep(3600)
        if MODE.startswith("slow:") or MODE.startswith("late:") and completions == 1:
            time.sleep(float(MODE.partition(":")[2]))
        if MODE == "not_json":
            self.answer(200, b"Internal Server Error")
            return
        self.answer(200, json.dumps(completion(body)).encode())


def main() -> None:
    global ORDER
    record_pid()
    with open(PIDS + ".started", "a") as out:
        out.write(f"{os.getpid()}\n")
    ORDER = started()
    if MODE == "exit":
        sys.stderr.write("fake server: RuntimeError: no such model\n")
        sys.exit(1)
    if MODE == "sigill":
        sys.stderr.write("fake server: warm-up: ValueError: an unrelated warning\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGILL)
    if MODE == "self_kill":
        sys.stderr.write('Traceback (most recent call last):\n  File "scheduler.py", line 1, in run\n'
                         "NotImplementedError: \"rmsnorm_kernel\" not implemented for 'Float'\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if (MODE == "child" or MODE.startswith("slow:")) and os.fork() == 0:
        record_pid()
        time.sleep(3600)
        os._exit(0)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()


if __name__ == "__main__":
    main()
