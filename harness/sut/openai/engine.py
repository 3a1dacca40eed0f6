"""Any HTTP inference server under test (``engine = "openai"``): started per cell from the matrix file's
``[server]`` table, driven over its wire format, stopped by its process group.

A cell's server starts on 127.0.0.1 at a free port, in a process group of its own (``harness.sut.process``),
its output in a log file; the harness waits for its health URL, then serves each workload's passes as HTTP
requests (a round's requests in flight together) and reads back the tokens, logprobs, cached prompt tokens and
speculative counters from where the file says they are. Between workloads the server's cache is emptied
(``reset``) or, without a reset URL, the server is started afresh. A server that exits, never becomes healthy,
hangs past the cell's timeout or answers a field the format does not allow raises ``ServerError`` naming what
happened, with the tail of its output; the cell becomes an ``error`` row. Closing stops the whole process
group, whatever happened (Ctrl-C included): no server outlives its cell.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from fixtures.workloads import Workload
from harness.sut.base import CacheTraits, PassResult, SpecTraits, Totals, Traits
from harness.sut.inputs import InputsCheck, Watch
from harness.sut.openai import LEVELS, llamacpp, sglang, vllm
from harness.sut.openai.launch import Launch, free_port
from harness.sut.openai.server import ServerProcess
from harness.sut.openai.wire import API, Reply, ServerError, field_at, metric_sums, pass_counters, request_output
from harness.sut.process import LOGS_ENV
from harness.sut.vllm_common.cache import nixl_backoff
from harness.sut.vllm_common.nixl import failure_lines
from reference_impl.request import RequestOutput, RequestSpec

#: the top logprobs asked per step: the top-2 margin tells a tie from a divergence.
TOP_LOGPROBS = 2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: how a healthy server is read back (``[server] read_back``): the cell's traits as it applied them (its cache rule,
#: the settings it reports, its proposer's rule); a server read back by none keeps the shared paged-cache rule
READ_BACK = {"llamacpp": llamacpp.read_traits, "sglang": sglang.read_traits, "vllm": vllm.read_traits}
#: what a server's KV connectors moved so far, from its metrics: a PD pair's ledger (``[server] read_back``)
MOVED = {"vllm": vllm.moved}
#: seconds a cache reset is retried while the server answers that it could not (vLLM's ``{"success": false}`` while
#: blocks are held: a prefill server's leased blocks stay held until the decode server has read them).
SETTLE_S = 20.0
RESET_POLL_S = 0.25
#: who could write a request body during its call: the server is another process and cannot touch the caller's
#: memory, so what the ``inputs`` oracle judges of a server is the harness's own client (building, sending, handing off).
CLIENT_WHERE = "the harness's HTTP client only: the server is another process and cannot write the caller's memory"


def server_traits(server: Mapping, levels: Mapping[str, object]) -> Traits:
    """What the oracles know of a server cell, from the levels they read (the factors of ``LEVELS``)."""
    page_size = int(levels["page_size"])
    return Traits(
        dtype=DTYPES[str(levels["dtype"])], model=f"{server['name']}-{levels['model']}",
        hybrid=levels["model"] == "hybrid", deterministic=levels["deterministic"] == "on",
        spec=SpecTraits(method=str(levels["spec"]), k=int(levels["num_draft_tokens"]), pass_counted=True),
        cache=CacheTraits(enabled=levels["cache"] != "off", page_size=page_size, chunk_size=page_size,
                          state_interval=page_size),
        audited=False, pd=levels["pd"] != "off",
    )


class ServerEngine:
    """A server for one cell: started at the first workload, its cache emptied (or itself restarted) for each next."""

    def __init__(self, levels: Mapping[str, object], faults: frozenset[str], device: str,
                 server: Mapping[str, object]) -> None:
        if faults:
            raise ValueError(f"faults are planted in the reference engine; a server cell takes none ({', '.join(faults)})")
        self.server = server
        self.levels = LEVELS.full(levels)
        self.traits = server_traits(server, self.levels)
        self.start_timeout_s = float(server["start_timeout_s"])
        self.request_timeout_s = float(server["request_timeout_s"])
        self.process: ServerProcess | None = None  # the server the client reads its answers from (PD: the decode one)
        self.prefill: ServerProcess | None = None  # PD: the server every request is prefilled on first
        self.pd = self.levels["pd"] != "off"
        self.emptied = True  # every cache asked to empty for the workload is empty
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
        name = re.sub(r"[^\w.+-]", "_", str(server["name"]))
        self.log_stem = f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:10]}"

    def running(self) -> tuple[ServerProcess, float]:
        """The cell's server (a PD cell's: both), healthy and with an empty cache (started now, reset, or restarted),
        and the wall seconds it took to start now (0 when it was running already)."""
        if self.process is not None and self.served:
            if self.server["reset"] is None:
                self._stop()
            else:
                self.emptied = all([self._reset(p) for p in (self.prefill, self.process) if p is not None])
                if not self.emptied and not self.pd:
                    raise ServerError(f"{self.server['reset']} did not empty the cache within {SETTLE_S:g} s "
                                      "(the server kept answering that blocks are held)")
        started = 0.0
        if self.process is None:
            began = time.perf_counter()
            self.starts += 1
            if self.pd:  # both start side by side; whichever started is stopped with the cell
                self.prefill = self._start("prefill")
            self.process = self._start("decode" if self.pd else None)
            for process in (self.prefill, self.process):
                if process is not None:
                    process.wait_healthy(self.server["health"], self.start_timeout_s)
            self.emptied = True
            started = time.perf_counter() - began
            self._read_back()
        self.served = True
        return self.process, started

    def _start(self, role: str | None) -> ServerProcess:
        """One server of the cell (``role``: a PD side, or None), launched and not yet healthy."""
        port = free_port()
        launch = Launch(self.server, self.levels, port, role)
        if role != "prefill":
            self.launch = launch
        stem = self.log_stem if role is None else f"{self.log_stem}-{role}"
        return ServerProcess(launch.argv, launch.env, port, self.log_dir / f"{stem}-{self.starts}.log")

    def _reset(self, process: ServerProcess) -> bool:
        """Empty ``process``'s cache; whether it took (retried within ``SETTLE_S`` while the server says it did not)."""
        deadline = time.perf_counter() + SETTLE_S
        while True:
            # SGLang's /flush_cache answers in plain text ("Cache flushed. ..."), HTTP 400 when it could not
            answer = process.call(self.server["reset"], {}, self.request_timeout_s, "to the cache reset", text_ok=True)
            if not (isinstance(answer, dict) and answer.get("success") is False):
                return True
            if time.perf_counter() > deadline:
                return False
            time.sleep(RESET_POLL_S)

    def _read_back(self) -> None:
        """The cache rule the server's cells are judged by and the settings it applied, as it reports them (a PD
        cell's: the decode server's, which the client's answers come from)."""
        read = READ_BACK.get(self.server["read_back"])
        if read is not None:
            self.traits = read(self.process, self.launch, server_traits(self.server, self.levels),
                               self.request_timeout_s)

    def session(self, workload: Workload) -> ServerSession:
        return ServerSession(self)

    def _stop(self) -> None:
        try:
            if self.prefill is not None:
                self.prefill.stop()
        finally:
            self.prefill = None
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
        return ServerSystem(self.engine, process, alone, started, self.engine.emptied)

    def close(self) -> None:
        pass


class ServerSystem:
    """The running server behind the system-under-test protocol; closing leaves the server to the cell."""

    def __init__(self, engine: ServerEngine, process: ServerProcess, alone: bool, start_seconds: float,
                 emptied: bool = True) -> None:
        self.engine = engine
        self.process = process
        self.prefill = engine.prefill
        self.alone = alone
        self.traits = engine.traits
        self.emptied = emptied
        self.passes = 0
        self.seconds = {"start": start_seconds, "requests": 0.0}
        self.prefill_hits: dict[str, int] = {}  # PD: the prefill server's hit for each request of the pass
        self.moved = MOVED.get(engine.server["read_back"]) if self.prefill is not None else None
        # this pass's request bodies, as the harness's client left them
        self.untouched = InputsCheck(call=f"POST {engine.server['endpoint']}", where=CLIENT_WHERE)
        self.counting = threading.Lock()  # a round's requests are sent from threads of their own

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        server = self.engine.server
        # a server without a proposer may not export its speculative metrics at all; with one, each must be there
        counted = server["counters"] if self.traits.spec.method != "none" else {}
        metric_names = {name: where for name, (kind, where) in counted.items() if kind == "metric"}
        before = self._metrics() if metric_names else {}
        moved_before = self._moved() if self.moved is not None else None
        self.prefill_hits = {}
        self.untouched = InputsCheck(call=f"POST {server['endpoint']}", where=CLIENT_WHERE)
        outputs: list[RequestOutput] = []
        counters = {name: 0 for name in counted}
        placement: dict[str, int] = {}
        verified: dict[str, tuple[int, ...]] = {}
        began = time.perf_counter()
        for group in rounds:
            for batch in ([[r] for r in group] if self.alone else [list(group)]):
                for reply in self._together(batch):
                    outputs.append(reply.output)
                    for name in counters.keys() & reply.counters.keys():
                        counters[name] += reply.counters[name]
                    if reply.slot is not None:
                        placement[reply.output.rid] = reply.slot
                    if reply.verified is not None:
                        verified[reply.output.rid] = reply.verified
        self.seconds["requests"] += time.perf_counter() - began
        if metric_names:
            after = self._metrics()
            for name, metric in metric_names.items():
                if metric not in after:
                    raise ServerError(f"malformed metrics: {server['metrics']} has no {metric!r}")
                counters[name] = int(round(after[metric] - before.get(metric, 0.0)))
        self.passes += 1
        ledger = None if moved_before is None else self._ledger(moved_before, self._moved())
        return PassResult(outputs=outputs, counters=pass_counters(counters, outputs), placement=placement,
                          verified=verified, pd=ledger, inputs=[self.untouched])

    def _together(self, batch: list[RequestSpec]) -> list[Reply]:
        """``batch``'s requests in flight at once, answers in request order. On a timeout or Ctrl-C the threads are
        left to end with the server's sockets when the cell stops it, never waited on here."""
        pool = ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="kvmatrix-request")
        try:
            return list(pool.map(self._one, batch))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, request: RequestSpec) -> Reply:
        """``request`` served (a PD cell's: prefilled on one server, handed over, decoded on the other)."""
        server, launch = self.engine.server, self.engine.launch
        body = {**API[server["api"]].body(request, TOP_LOGPROBS, server["model_name"]), **launch.request}
        if server["priority"] is not None:
            body[server["priority"]] = request.priority
        what = f"to request {request.rid!r}"
        if self.prefill is not None:
            body[server["pd"]["handoff"]] = self._prefilled(request, body)
        doc = self._post(self.process, request.rid, body, what)
        return request_output(server, request, doc, counted=self.traits.spec.method != "none")

    def _post(self, process: ServerProcess, label: str, body: dict, what: str) -> object:
        """POST ``body`` to the server's endpoint on ``process``, watched: the harness's client must leave it as built
        (``label`` names its request in a finding)."""
        watch = Watch(lambda: {label: body})
        doc = process.call(self.engine.server["endpoint"], body, self.engine.request_timeout_s, what)
        changes = watch.changes()
        with self.counting:
            self.untouched.add(watch.compared, changes)
        return doc

    def _prefilled(self, request: RequestSpec, body: dict) -> object:
        """What the prefill server answers ``request`` in its ``handoff`` field (which the decode request carries);
        its hit kept for the pass's ledger."""
        pd = self.engine.server["pd"]
        what = f"to request {request.rid!r} on the prefill server"
        doc = self._post(self.prefill, f"{request.rid} (prefill server)", {**body, **pd["request"]}, what)
        handoff = doc.get(pd["handoff"]) if isinstance(doc, dict) else None
        if not isinstance(handoff, dict):
            raise ServerError(f"malformed response {what}: no {pd['handoff']} object to hand the decode server "
                              f"(got {handoff!r:.120})")
        self.prefill_hits[request.rid] = int(field_at(doc, self.engine.server["cached_tokens"], int, what))
        return handoff

    def _metrics(self) -> dict[str, float]:
        return metric_sums(self.process.text(self.engine.server["metrics"], self.engine.request_timeout_s))

    def _moved(self) -> dict[str, dict[str, int]]:
        """What each side's KV connectors moved so far."""
        return {side: self.moved(process.text(self.engine.server["metrics"], self.engine.request_timeout_s))
                for side, process in (("prefill", self.prefill), ("decode", self.process))}

    def _ledger(self, before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]) -> dict:
        """The pass's counted ledger (``harness.oracles.pd_audit``): what each side's connectors moved over the pass,
        the prefill server's hit per request, what each side logged of a failed NIXL transfer since the last pass,
        the decode side's block size as it applied it; bytes per block are not read back from a server (not judged).
        The decode server's cache was emptied before the workload's first pass only: a later pass finds there what
        the first one read."""
        sides = {side: {key: after[side][key] - before[side][key] for key in after[side]} for side in after}
        failures = {side: failure_lines(process.cursor.new())
                    for side, process in (("prefill", self.prefill), ("decode", self.process))}
        return {"kind": "counted", "connector": str(self.engine.levels["pd"]), "emptied": self.emptied,
                "decode_cold": self.passes == 1, "prefill_hits": dict(self.prefill_hits), "nixl_failures": failures,
                **sides,
                "block_size": self.traits.cache.page_size, "block_bytes": None, "state_bytes": 0,
                "backoff": nixl_backoff(self.traits.hybrid)}

    def totals(self) -> Totals:
        kept = [str(self.process.log_path)] if self.engine.keeps_logs else []
        return Totals(stats={}, seconds=dict(self.seconds), logs=kept)

    def close(self) -> None:
        pass
