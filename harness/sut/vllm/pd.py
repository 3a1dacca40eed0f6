"""vLLM's PD handoff under test (``pd = nixl``): a prefill engine and a decode engine, two children started side by
side, every request handed from one to the other as vLLM's toy proxy hands it.

Who owns a request's KV at each step of a handoff:

1. the prefill child computes the prompt (``max_tokens = 1``, ``kv_transfer_params`` asking for a remote decode); its
   blocks stay allocated after the request finishes, leased to the decode side, and its answer carries the
   ``kv_transfer_params`` that name them (engine, host, side-channel port, block ids);
2. the harness hands those parameters, untouched, to the same request on the decode child (``handoff``);
3. the decode child allocates its own blocks past its local prefix hit, reads the prefill side's blocks into them
   over NIXL (UCX over loopback, CPU memory on both sides) and notifies the prefill side, which frees its blocks at
   its next step; the decode child then decodes. Its ``num_cached_tokens`` is the prefill side's hit, by design.

The prefill side's own first token is never compared: the decode side computes it again (on the hybrid model the
prefill side even stops one token short). What crossed is in each side's metrics, kept per pass as the pass's
ledger (``PassResult.pd``) for the pd_audit oracle, with the layout and the rules it is judged by.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence

from harness.sut.base import PassResult, Totals, Traits
from harness.sut.inputs import InputsCheck
from harness.sut.vllm.connectors import NIXL_ENV, PD_ROLES, PREFILL_PARAMS, PREFILL_TOKENS, SIDE_CHANNEL_PORT_ENV, pd_config
from harness.sut.vllm.protocol import (
    INSIDE_COUNTERS, SCHEDULER_COUNTERS, SPEC_COUNTERS, ChildProcess, EngineChildError, add_counters, add_inputs,
    audit_problems, field, request_output, serve_message, start_message,
)
from harness.sut.vllm_common.nixl import failure_lines
from reference_impl.request import RequestOutput, RequestSpec


def free_port() -> int:
    """A TCP port free on the loopback now (each engine's NIXL side channel listens on one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: seconds an emptying prefill engine is stepped while it still holds blocks leased to the decode side.
SETTLE_S = 20.0
#: what both engines of a pair with a tier get: the tier's connector (ExampleConnector) is not ``SupportsHMA``, so
#: vLLM turns the hybrid KV cache manager off on the prefill side alone, NIXL's compatibility hash (which hashes
#: ``is_hma_enabled``) then differs between the sides and every handshake fails ("NIXL compatibility hash mismatch").
TIER_PAIR_ARGS: Mapping[str, object] = {"disable_hybrid_kv_cache_manager": True}


class PdPair:
    """A ``kv_producer`` (prefill) and a ``kv_consumer`` (decode) child, each a process group of its own, started side
    by side with the cell's arguments (a proposer on both: the decode side's KV layout, draft layers included, must be
    the prefill side's; a tier, the arguments' ``kv_transfer_config``, on the prefill side); ``backoff`` is the prompt
    tokens the decode side computes itself (``nixl_backoff``); ``levels`` the cell's, for its poison and audit (both
    sides: the decode side's blocks are poisoned before NIXL writes them); ``prefill`` the prefill side's own
    arguments over the cell's and ``hold`` the requests it holds at once (a tight pair's: ``prefill_blocks``)."""

    def __init__(self, level: str, arguments: Mapping[str, object], env: Mapping[str, str], backoff: int,
                 levels: Mapping[str, object] | None = None, prefill: Mapping[str, object] | None = None,
                 hold: int = 1) -> None:
        self.level, self.backoff = level, backoff
        self.tiered = "kv_transfer_config" in arguments
        tier = arguments.get("kv_transfer_config")
        if self.tiered:
            arguments = {**arguments, **TIER_PAIR_ARGS}
        self.sides: dict[str, ChildProcess] = {}
        started = time.perf_counter()
        try:
            for side, role in zip(("prefill", "decode"), PD_ROLES):
                child = ChildProcess({**env, **NIXL_ENV, SIDE_CHANNEL_PORT_ENV: str(free_port())}, name=f"{side} engine")
                self.sides[side] = child
                config = pd_config(level, role, tier)
                own, held = (prefill or {}, hold) if side == "prefill" else ({}, 1)
                child.send(start_message({**arguments, **own, "kv_transfer_config": config}, levels or {}, hold=held))
            #: each side's start answer: what vLLM applied there (``applied``) and what its child raised (``resized``)
            self.started = {side: child.receive("start") for side, child in self.sides.items()}
            self.layout = self.decode.ask({"op": "layout"})
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - started

    @property
    def prefill(self) -> ChildProcess:
        return self.sides["prefill"]

    @property
    def decode(self) -> ChildProcess:
        return self.sides["decode"]

    def handoff(self, group: Sequence[RequestSpec], prefilled: Sequence[Mapping]) -> list[Mapping]:
        """The decode side's ``kv_transfer_params`` for each request of ``group``: what the prefill side answered for
        that request, as it answered it."""
        params = []
        for request, out in zip(group, prefilled):
            if out.get("rid") != request.rid or not isinstance(out.get("kv_transfer_params"), dict):
                raise EngineChildError(f"the prefill engine answered no kv_transfer_params for request {request.rid!r} "
                                       f"(got {out.get('kv_transfer_params')!r:.120} for {out.get('rid')!r})")
            params.append(out["kv_transfer_params"])
        return params

    def reset(self, *, decode: bool = True, connector: bool = True) -> bool:
        """Empty the prefill side's prefix cache (and its tier's, ``connector``) and, ``decode``, the decode side's;
        whether every cache asked is empty (the prefill side's frees its leased blocks at a later step: it is stepped,
        within ``SETTLE_S``, until they are free)."""
        done = self.prefill.ask({"op": "reset", "reset_connector": connector, "settle_s": SETTLE_S})["reset"]
        if decode:
            done = self.decode.ask({"op": "reset", "settle_s": SETTLE_S})["reset"] and done
        return bool(done)

    def close(self) -> None:
        """Stop both children, whatever happens to either."""
        try:
            for child in self.sides.values():
                child.close()
        finally:
            self.sides = {}


class PdSystem:
    """A PD pair behind the system-under-test protocol: each round prefilled on one side, handed over, decoded on the
    other; a warm pass is a second handoff of the same prompts on the same pair. Closing leaves the pair to the cell."""

    def __init__(self, pair: PdPair, traits: Traits, start_seconds: float, emptied: bool = True) -> None:
        self.pair = pair
        self.traits = traits
        self.emptied = emptied  # the pair's caches were emptied for this workload (a fresh pair's are)
        self.passes = 0
        self.seconds = {"start": start_seconds, "prefill": 0.0, "requests": 0.0}
        self.moved = {"transfers": 0, "bytes": 0, "tokens": 0, "failed": 0}

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        # a later pass of a tiered pair must load from the prefill side's tier: both device caches are emptied first,
        # the tier kept, so the decode side (which has no tier) starts as cold as in the first pass
        decode_cold = not self.passes or self.pair.tiered
        if self.pair.tiered and self.passes:
            self.emptied = self.pair.reset(connector=False)
        self.passes += 1
        outputs: list[RequestOutput] = []
        sides: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
        hits: dict[str, int] = {}
        problems: list[str] = []
        untouched: dict[str, InputsCheck] = {}
        for group in rounds:
            prefilled = self.pair.prefill.ask(serve_message(group, max_new_tokens=PREFILL_TOKENS,
                                                            handoff=[dict(PREFILL_PARAMS) for _ in group]))
            prefill_outputs = field(prefilled, "outputs", list)
            hits.update({str(out["rid"]): int(field(out, "num_cached_tokens", int)) for out in prefill_outputs})
            decoded = self.pair.decode.ask(serve_message(group, handoff=self.pair.handoff(group, prefill_outputs)))
            outputs += [request_output(out) for out in field(decoded, "outputs", list)]
            self.seconds["prefill"] += float(field(prefilled, "seconds", (int, float)))
            self.seconds["requests"] += float(field(decoded, "seconds", (int, float)))
            add_counters(sides["prefill"], prefilled, "")
            add_counters(sides["decode"], decoded, "")
            problems += audit_problems(prefilled, "prefill: ") + audit_problems(decoded, "decode: ")
            add_inputs(untouched, prefilled, "prefill engine's ")
            add_inputs(untouched, decoded, "decode engine's ")
        # the proposer runs on both sides, but only the decode side decodes: its counters are the pass's; either side
        # may preempt (and evict) under KV pressure
        counters = {name: sides["decode"].pop(name) for name in SPEC_COUNTERS}
        for name in SPEC_COUNTERS:
            sides["prefill"].pop(name)
        for name in (*SCHEDULER_COUNTERS, *INSIDE_COUNTERS):
            if name in sides["prefill"] or name in sides["decode"]:
                counters[name] = sides["prefill"].pop(name, 0) + sides["decode"].pop(name, 0)
        failures = {side: failure_lines(child.log.new()) for side, child in self.pair.sides.items()}
        return PassResult(outputs=outputs, counters=counters, audit=problems,
                          pd=self._ledger(sides, hits, decode_cold, failures), inputs=list(untouched.values()))

    def _ledger(self, sides: Mapping[str, Mapping[str, int]], hits: Mapping[str, int], decode_cold: bool,
                failures: Mapping[str, list[str]]) -> dict:
        """The pass's ledger: each side's connector counters, the prefill side's hit per request, what each side
        logged of a failed NIXL transfer since the last pass, and what they are judged by (the decode side's KV
        layout, how many prompt tokens it computes itself, whether its prefix cache was empty at the pass's start)."""
        decode = sides["decode"]
        self.moved["transfers"] += decode["nixl_transfers"]
        self.moved["bytes"] += decode["nixl_bytes"]
        self.moved["tokens"] += decode["external_kv_transfer"]
        self.moved["failed"] += decode["nixl_failed_transfers"] + sides["prefill"]["nixl_failed_transfers"]
        layout = self.pair.layout
        return {"kind": "counted", "connector": self.pair.level, "emptied": self.emptied, "decode_cold": decode_cold,
                "prefill_hits": dict(hits), "nixl_failures": {side: list(lines) for side, lines in failures.items()},
                "prefill": dict(sides["prefill"]), "decode": dict(decode), "block_size": layout["block_size"],
                "block_bytes": layout["block_bytes"], "state_bytes": layout["state_bytes"], "backoff": self.pair.backoff}

    def totals(self) -> Totals:
        return Totals(stats={}, pd=dict(self.moved), seconds=dict(self.seconds))

    def close(self) -> None:
        pass
