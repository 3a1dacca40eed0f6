"""The engine a PD cell runs: a prefill engine, a decode server and the transport, stepped together.

One loop step: bootstrap as many waiting requests as the decode side has room for (in arrival
order; a request reaches the prefill queue only once the decode side has preallocated, as in
SGLang's bootstrap queue); one prefill step; send every whole page computed since the last send
(the last chunk when a request has its first token); one decode step. So continuous batching goes
on on both sides while transfers are in flight, and a decode-side free (and the compaction it may
ask for) can fall between two chunks of another request. A failed transfer is aborted on both
sides and retried once; a second failure reports the request as aborted, never as a wrong token.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields

from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import EngineStallError, EngineStats
from reference_impl.faults import PD_PARTIAL_PAGE_EARLY
from reference_impl.pd.handoff import Transfer, TransferFailed, TransferState
from reference_impl.pd.ledger import DECODE_COUNTS, AttemptRecord, PassLedger
from reference_impl.pd.prefill import KVSender, PrefillEngine
from reference_impl.request import RequestOutput, RequestSpec


@dataclass(slots=True)
class PDStats:
    """What crossed, per engine lifetime: a cell reports these next to its verdicts."""

    transfers: int = 0
    chunks: int = 0
    pages_sent: int = 0
    kv_bytes: int = 0
    bytes_sent: int = 0
    decode_hit_pages: int = 0     # pages the decode side already held (its own prefix hit): never sent
    failed: int = 0
    retried: int = 0
    aborted: int = 0

    def to_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class DisaggEngine:
    """Serves RequestSpecs through a prefill engine and a decode server; same interface as Engine."""

    def __init__(self, config: EngineConfig) -> None:
        if config.pd is None:
            raise ValueError("DisaggEngine needs a transport (pd = inproc, nixl or your own)")
        self.config = config
        self.transport = config.pd()
        self.prefill = PrefillEngine(config)
        self.decode = self.transport.connect(config)
        try:
            self.sender = KVSender(self.prefill, self.decode.layout, self.transport, config)
            self.transport.register(self.sender.regions)
        except BaseException:
            self.close()
            raise
        self.pending: deque[Transfer] = deque()
        self.transfers: dict[str, Transfer] = {}
        self.pd = PDStats()
        self._attempts: dict[tuple[str, int], AttemptRecord] = {}  # this pass's, by (rid, attempt)
        self._decode_counts = dict.fromkeys(DECODE_COUNTS, 0)      # the decode side's, when the pass began

    @property
    def cache(self) -> object:
        """The prefill side's prefix cache: what the client's cached_tokens count."""
        return self.prefill.cache

    @property
    def stats(self) -> EngineStats:
        """Both engines' counters, added up."""
        decode = self.decode.engine_stats()
        return EngineStats(**{f.name: getattr(self.prefill.stats, f.name) + getattr(decode, f.name) for f in fields(EngineStats)})

    @property
    def nan_events(self) -> list:
        return [*self.prefill.nan_events, *self.decode.nan_events()]

    @property
    def verify_scratch_bytes(self) -> dict[str, int]:
        """Verify scratch each side allocated: the prefill side must allocate none (SGLang #34191)."""
        prefill = self.prefill.verify_scratch.nbytes if self.prefill.verify_scratch else 0
        return {"prefill": prefill, "decode": self.decode.counters()["verify_scratch_bytes"]}

    def counters(self) -> dict[str, object]:
        """PD figures for a cell's metrics: what crossed, the move gate's refusals, verify scratch per side."""
        return {**self.pd.to_json(), "gate_refusals": self.decode.counters()["gate_refusals"],
                "verify_scratch_bytes": self.verify_scratch_bytes}

    def take_ledger(self) -> PassLedger:
        """What both sides recorded since the last call (one pass): every attempt, the decode side's takes and
        returns of staging regions and metadata slots, and each side's verify scratch."""
        counts = self.decode.counters()
        ledger = PassLedger(list(self._attempts.values()),
                            {k: counts[k] - self._decode_counts[k] for k in DECODE_COUNTS}, self.verify_scratch_bytes)
        self._attempts, self._decode_counts = {}, {k: counts[k] for k in DECODE_COUNTS}
        return ledger

    # -- serving ---------------------------------------------------------------------------
    def generate(self, specs: Sequence[RequestSpec]) -> list[RequestOutput]:
        """Run ``specs`` to completion through both sides; rejections first, then in finishing order."""
        outputs: list[RequestOutput] = []
        seen: set[str] = set()
        for spec in specs:
            reason = self.prefill.rejection(spec, seen)  # both sides share one config
            seen.add(spec.rid)
            if reason:
                outputs.append(RequestOutput.empty(spec.rid, "rejected", reason))
            else:
                self.pending.append(Transfer(spec))
        while self.pending or self.transfers or self.prefill.has_work() or self.decode.has_work():
            progressed = self._bootstrap()
            progressed |= self.prefill.step([])
            progressed |= self._send(outputs)
            progressed |= self.decode.step(outputs)
            if not progressed:
                raise EngineStallError(f"PD: {len(self.pending)} bootstrapping, {len(self.transfers)} in flight; "
                                       f"prefill {self.prefill.stall_report()}")
        return outputs

    def _bootstrap(self) -> bool:
        """Preallocate on the decode side for waiting requests, in order, while it has room."""
        progressed = False
        while self.pending:
            t = self.pending[0]
            boot = self.decode.bootstrap(t.spec, t.attempt)
            if boot is None:
                break
            self.pending.popleft()
            t.bootstrap, t.next_page = boot, boot.decode_prefix_pages
            t.advance(TransferState.WAITING_FOR_INPUT)
            self.transfers[t.rid] = t
            self.sender.track(t)
            self.pd.transfers += 1
            self.pd.decode_hit_pages += boot.decode_prefix_pages
            self._attempts[(t.rid, t.attempt)] = AttemptRecord(t.rid, t.attempt, len(t.spec.prompt),
                                                               boot.decode_prefix_pages)
            self.prefill.submit([RequestSpec(t.rid, t.spec.prompt, 1, t.spec.priority)])
            progressed = True
        return progressed

    def _send(self, outputs: list[RequestOutput]) -> bool:
        """Send what each request computed since its last chunk; the last chunk once it has its first token."""
        progressed = False
        page_size = self.config.page_size
        for t in list(self.transfers.values()):
            req = self.prefill.request(t.rid)
            if req is None:
                continue
            last = t.rid in self.prefill.inflight
            whole = -(-req.num_computed // page_size) if PD_PARTIAL_PAGE_EARLY.name in self.config.faults \
                else req.num_computed // page_size  # the fault: a page half computed counts as sent
            end = len(req.pages) if last else min(whole, len(req.pages))
            if not last and end <= t.next_page:
                continue
            progressed = True
            chunks_before = t.chunks
            try:
                self.sender.send(t, req, end, last)
            except TransferFailed as exc:
                self._fail(t, str(exc), outputs)
                continue
            finally:
                self.pd.chunks += t.chunks - chunks_before
            if last:
                t.advance(TransferState.SUCCESS)
                self._end(t)
                record = self._attempts[(t.rid, t.attempt)]
                record.outcome, record.prefill_hit = "success", self.prefill.release(t.rid)
        return progressed

    def _end(self, t: Transfer) -> None:
        del self.transfers[t.rid]
        self.sender.untrack(t)
        self._attempts[(t.rid, t.attempt)].pages_sent = t.pages_sent
        self.pd.pages_sent += t.pages_sent
        self.pd.bytes_sent += t.bytes_sent
        self.pd.kv_bytes += t.kv_bytes

    def _fail(self, t: Transfer, reason: str, outputs: list[RequestOutput]) -> None:
        """Abort both sides; retry once, then report the request aborted."""
        t.advance(TransferState.FAILED, reason)
        self._end(t)
        record = self._attempts[(t.rid, t.attempt)]
        record.outcome = "failed"
        record.decode_live_after = tuple(self.decode.abort(t.rid, t.attempt))
        self.prefill.abort(t.rid)
        record.prefill_held_after = self.prefill.request(t.rid) is not None
        self.pd.failed += 1
        if t.attempt == 0:
            self.pd.retried += 1
            self.pending.append(Transfer(t.spec, attempt=1))
        else:
            self.pd.aborted += 1
            outputs.append(RequestOutput.empty(t.rid, "aborted", f"transfer failed twice; last: {reason}"))

    # -- audit and shutdown -------------------------------------------------------------------
    def audit(self) -> list[str]:
        """Both sides' idle audits, and no transfer or parked request left."""
        problems = [f"prefill: {p}" for p in self.prefill.audit()] + [f"decode: {p}" for p in self.decode.audit()]
        if self.prefill.inflight:
            problems.append(f"prefill: {len(self.prefill.inflight)} request(s) parked after their transfer")
        if self.pending or self.transfers:
            problems.append(f"{len(self.pending)} transfer(s) bootstrapping, {len(self.transfers)} in flight when idle")
        return problems

    def close(self) -> None:
        """Stop the decode side (a child process for nixl)."""
        self.decode.close()
