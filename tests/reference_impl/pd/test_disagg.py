"""PD disaggregation: the handoff is invisible in the output, moves exactly the pages past the decode
side's hit, survives lost chunks without losing or leaking anything, and never moves a page in flight."""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.sut.reference.engine import build_engine_config
from harness.matrix.model import generate
from harness.matrix.file import load_matrix
from harness.run.golden import GoldenRuns
from harness.run.cell import run_cell
from reference_impl import registry
from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine
from reference_impl.memory.layout import TransferLayoutError
from reference_impl.pd.disagg import DisaggEngine
from reference_impl.pd.handoff import Transfer, TransportError
from reference_impl.pd.inproc.conn import InprocTransport
from reference_impl.pd.wire import page_kv_blocks
from reference_impl.request import RequestSpec


def pd_setup(workload: str = "system_prompt", **levels: object) -> tuple[list[RequestSpec], EngineConfig]:
    """A workload's requests and the engine config of ``levels`` (PD defaults: page 16, chunks of 32 tokens)."""
    wl = load_workload(workload)
    config = build_engine_config({"page_size": 16, "prefill_budget": 32, "cache": "device", **levels}, wl, frozenset())
    return list(wl.requests), config


def observable(out: object) -> tuple:
    """Everything a client sees of a request, bit for bit."""
    return (out.tokens, out.logprobs, out.top_ids, out.top_logprobs, out.margins, out.cached_tokens,
            out.cached_by_tier(), out.finish_reason, out.accepted, out.drafted)


CONFIGS = [
    {},
    {"pd_staging": "on"},
    {"decode_tp": 2},
    {"decode_tp": 2, "pd_staging": "on", "page_size": 1},
    {"model": "hybrid", "pool": "unified", "pd_staging": "on"},
    {"model": "hybrid", "spec": "draft", "decode_tp": 2},
    {"spec": "mtp", "pool": "unified", "cache": "host"},
    {"model": "hybrid", "spec": "ngram", "cache": "off"},
]


@pytest.mark.parametrize("levels", CONFIGS, ids=lambda levels: "-".join(f"{k}:{v}" for k, v in levels.items()) or "dense")
def test_pd_is_invisible_to_the_client(levels: dict[str, object]) -> None:
    """Deterministic mode: every output of both passes is bitwise the one plain engine's, cached tokens included."""
    specs, config = pd_setup(**levels)
    plain = Engine(config)
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    for name in ("cold", "warm"):
        want = {o.rid: observable(o) for o in plain.generate(specs)}
        got = {o.rid: observable(o) for o in pd.generate(specs)}
        assert got == want, f"{name} pass differs"
        assert pd.audit() == []


def per_page_bytes(pd: DisaggEngine) -> int:
    """KV bytes one page costs on the wire: every pool and layer, every decode shard."""
    layout = pd.decode.layout
    return sum(length for shard in range(layout.shards) for _, _, length in page_kv_blocks(layout, 0, shard))


@pytest.mark.parametrize("levels", [{}, {"decode_tp": 2, "spec": "draft"}, {"pd_staging": "on", "pool": "unified"}],
                         ids=["dense", "tp2-draft", "staging-unified"])
def test_bytes_sent_are_the_pages_past_the_decode_hit(levels: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each transfer sends exactly its pages from the decode side's own prefix hit on, whole, and no more."""
    specs, config = pd_setup(**levels)
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    done: list[Transfer] = []
    end = pd._end
    monkeypatch.setattr(pd, "_end", lambda t: (done.append(t), end(t)))
    for _ in range(2):
        pd.generate(specs)
    page_bytes = per_page_bytes(pd)
    prompt = {s.rid: len(s.prompt) for s in specs}
    hits = [t.bootstrap.decode_prefix_pages for t in done]
    assert len(done) == 2 * len(specs) and sum(hits) > 0, "the warm pass must hit the decode side's cache"
    for t in done:
        pages = -(-prompt[t.rid] // config.page_size) - t.bootstrap.decode_prefix_pages
        assert (t.pages_sent, t.kv_bytes) == (pages, pages * page_bytes), t.rid
    assert pd.pd.decode_hit_pages == sum(hits)


def test_the_decode_hit_shows_as_fewer_pages_never_as_cached_tokens() -> None:
    """cached_tokens counts what the prefill side did not compute; the decode side's hit only saves pages."""
    specs, config = pd_setup()
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    plain = Engine(config)
    for _ in range(2):
        want = {o.rid: o.cached_tokens for o in plain.generate(specs)}
        assert {o.rid: o.cached_tokens for o in pd.generate(specs)} == want
    assert pd.pd.decode_hit_pages > 0


def test_a_prefill_server_allocates_no_verify_scratch() -> None:
    """SGLang #34191: a hybrid spec model verifies only on the decode side, so only it pays for the scratch."""
    specs, config = pd_setup(model="hybrid", spec="draft")
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    pd.generate(specs)
    assert pd.verify_scratch_bytes["prefill"] == 0
    assert pd.verify_scratch_bytes["decode"] == Engine(config).verify_scratch.nbytes > 0


@pytest.mark.parametrize("staging", ["off", "on"])
def test_a_unified_envelope_is_never_cut_into_head_slices(staging: str) -> None:
    """Two decode shards need head slices; a unified pool's envelope moves whole, so PD refuses loudly."""
    specs, config = pd_setup(pool="unified", decode_tp=2, pd_staging=staging)
    with pytest.raises(TransferLayoutError, match="envelope"):
        DisaggEngine(replace(config, pd=InprocTransport)).generate(specs)


def test_pd_refuses_an_eager_unified_pool() -> None:
    """An eager pool moves pages on every free, under any transfer in flight: PD needs lazy compaction."""
    specs, config = pd_setup(pool="reference_impl.memory.unified:EagerUnifiedPool")
    with pytest.raises(ValueError, match="lazy compaction"):
        DisaggEngine(replace(config, pd=InprocTransport))


def test_the_move_gate_holds_compaction_while_a_transfer_is_in_flight() -> None:
    """pd_churn asks a lazy unified pool to compact under a transfer in flight: the gate refuses, tokens stay right."""
    specs, config = pd_setup("pd_churn", pool="unified")
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    plain = Engine(config)
    for _ in range(2):
        want = {o.rid: observable(o) for o in plain.generate(specs)}
        assert {o.rid: observable(o) for o in pd.generate(specs)} == want
    assert pd.counters()["gate_refusals"] > 0


def serve_lossy(specs: list[RequestSpec], config: EngineConfig) -> tuple[DisaggEngine, list[list]]:
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    passes = []
    for _ in range(2):
        passes.append(pd.generate(specs))
        assert pd.audit() == [], "a failed transfer left memory behind"
    return pd, passes


@pytest.mark.parametrize("levels", [{"pd_staging": "on"}, {"model": "hybrid", "pool": "unified", "spec": "draft"}],
                         ids=["dense-staging", "hybrid-unified-draft"])
def test_lost_chunks_abort_both_sides_retry_once_and_lose_nothing(levels: dict[str, object]) -> None:
    """pd_fail_rate: every request ends once, right or reported aborted; nothing leaks; the run repeats exactly."""
    specs, config = pd_setup("burst", pd_fail_rate=0.3, **levels)
    want = {o.rid: o.tokens for o in Engine(config).generate(specs)}
    pd, passes = serve_lossy(specs, config)
    for outputs in passes:
        assert sorted(o.rid for o in outputs) == sorted(want), "a request was lost or finished twice"
        for out in outputs:
            if out.finish_reason == "aborted":
                assert out.tokens == [] and "failed twice" in out.error
            else:
                assert out.tokens == want[out.rid]
    assert pd.pd.failed > 0 and pd.pd.retried > 0 and pd.pd.aborted > 0
    _, again = serve_lossy(specs, config)
    assert [[observable(o) for o in p] for p in again] == [[observable(o) for o in p] for p in passes]


# -- transports with the decode server in a child process --------------------------------------------
#: pd level → (module whose import proves the transport can run here, how to install it)
CHILD_TRANSPORTS = {
    "nixl": ("nixl._api", "pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1"),
    "mooncake": ("mooncake.engine", "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 and "
                                    "apt-get install --no-install-recommends libibverbs1"),
}


def child_transport(level: str) -> type:
    """The transport class of ``pd = level``; skip when it cannot run here, except under CI=true, where that fails."""
    probe, install = CHILD_TRANSPORTS[level]
    transport = registry.resolve("pd", level)  # first: it quiets the library's logging before its import
    try:
        importlib.import_module(probe)
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pd={level} cannot run ({exc}), and CI=true requires its tests to (make installs it)")
        pytest.skip(f"pd={level} cannot run here ({exc}): {install}; CI=true makes this a failure")
    return transport


@pytest.mark.parametrize("level", sorted(CHILD_TRANSPORTS))
@pytest.mark.parametrize("levels", [{"decode_tp": 2, "pd_staging": "on", "spec": "draft"},
                                    {"model": "hybrid", "pool": "unified", "spec": "mtp"}],
                         ids=["tp2-staging-draft", "hybrid-unified-mtp"])
def test_a_child_process_transport_moves_the_same_bytes_as_inproc(level: str, levels: dict[str, object]) -> None:
    """The decode server in a child process, pages written over NIXL or Mooncake: outputs and counters equal
    in-process PD's, bit for bit."""
    specs, config = pd_setup(**levels)
    inproc = DisaggEngine(replace(config, pd=InprocTransport))
    remote = DisaggEngine(replace(config, pd=child_transport(level)))
    try:
        for _ in range(2):
            want = {o.rid: observable(o) for o in inproc.generate(specs)}
            assert {o.rid: observable(o) for o in remote.generate(specs)} == want
            assert remote.audit() == []
        assert remote.counters() == inproc.counters()
    finally:
        child = remote.transport.process
        remote.close()
    assert remote.transport.process is None and not child.is_alive(), "close() left the decode child running"


KILL_MATRIX = """
[matrix]
name = "child_kill"
mode = "full"
workloads = ["pair"]
timeout_s = 120

[factors]
pd = ["{level}"]
"""


@pytest.mark.parametrize("level", sorted(CHILD_TRANSPORTS))
def test_a_killed_decode_child_ends_the_cell_as_an_error_within_seconds(
    level: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The decode process dies mid-run: the cell is an error naming the transport, long before its timeout."""
    transport = child_transport(level)
    writes = {"n": 0}
    write = transport.write

    def write_then_kill(self: object, pairs: object, header: object) -> None:
        writes["n"] += 1
        if writes["n"] == 3:
            self.process.kill()
        write(self, pairs, header)

    monkeypatch.setattr(transport, "write", write_then_kill)
    path = tmp_path / "child_kill.toml"
    path.write_text(KILL_MATRIX.format(level=level))
    spec = load_matrix(str(path))
    started = time.perf_counter()
    (cell,) = generate(spec)
    result = run_cell(spec, cell, faults=frozenset(), goldens=GoldenRuns())
    assert writes["n"] >= 3, "the child was never killed"
    assert result.status == "error" and "TransportError" in result.error, result.error
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("level", sorted(CHILD_TRANSPORTS))
def test_killing_the_child_raises_transport_error_on_the_next_call(level: str) -> None:
    specs, config = pd_setup()
    pd = DisaggEngine(replace(config, pd=child_transport(level)))
    try:
        pd.transport.process.kill()
        pd.transport.process.join(5)
        with pytest.raises(TransportError, match="decode process"):
            pd.generate(specs)
    finally:
        pd.close()
