"""pool_audit, batch_invariance and cached_tokens seen to fire: damage planted in a real engine or run reaches the oracle.

Each pool_audit check (a leaked page, a page or slot owned twice, a freed page read) is planted in a
live engine and must come out of ``Engine.audit`` as the oracle's finding; the alone-vs-batch half of
batch_invariance must fail when the alone runs differ from the batch in any bit; cached_tokens must fail
on a hit lost in a capped pass and in a later round of the cold pass (its lower bounds).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import harness.sut.reference.engine as reference
from fixtures.workloads import load_workload
from harness.matrix.model import generate
from harness.matrix.file import load_matrix
from harness.oracles import oracles
from harness.run.golden import GoldenRuns
from harness.run.cell import run_cell
from reference_impl.engine.llm_engine import Engine
from tests.harness.oracles.test_oracles import baseline, view


def warm_engine(make_engine, model: str = "dense") -> Engine:
    wl = load_workload("system_prompt")
    engine = make_engine(wl, model=model, cache="device", page_size=16)
    engine.generate(wl.requests)
    assert engine.audit() == []
    return engine


def audit_verdict(problems: list[str]) -> tuple[str, str]:
    verdict = oracles()["pool_audit"]([view(baseline(), audit=problems)])
    return verdict.status, verdict.message


def test_a_leaked_page_fails_pool_audit(make_engine) -> None:
    engine = warm_engine(make_engine)
    engine.pools.alloc_pages(1)  # taken, owned by nobody
    status, message = audit_verdict(engine.audit())
    assert status == "fail" and "pages leaked" in message


def test_a_page_both_cached_and_free_fails_pool_audit(make_engine) -> None:
    engine = warm_engine(make_engine)
    cached_page = next(iter(engine.cache._pages))
    engine.pools.free_pages([cached_page])  # the tree still holds it: two owners
    status, message = audit_verdict(engine.audit())
    assert status == "fail" and "pages leaked" in message and f"free {engine.pools.num_free_pages}" in message


def test_a_state_slot_both_cached_and_free_fails_pool_audit(make_engine) -> None:
    engine = warm_engine(make_engine, model="hybrid")
    slot = next(iter(engine.cache._slots))
    engine.pools.free_state_slots([slot])
    status, message = audit_verdict(engine.audit())
    assert status == "fail" and "state slots leaked" in message


def test_a_page_held_by_two_nodes_fails_pool_audit(make_engine) -> None:
    engine = warm_engine(make_engine)
    first, second = [n for n in engine.cache._nodes() if n.pages][:2]
    second.pages[0] = first.pages[0]
    status, message = audit_verdict(engine.audit())
    assert status == "fail" and "also held elsewhere" in message


def test_reading_a_freed_page_fails_pool_audit(make_engine) -> None:
    wl = load_workload("pair")
    engine = make_engine(wl, page_size=16)
    engine.submit(wl.requests)
    outputs: list = []
    engine.step(outputs)  # prefill
    victim = engine.running[0]
    engine.pools.free_pages([victim.pages[-1]])  # freed under a running request
    engine.step(outputs)
    status, message = audit_verdict(engine.audit())
    assert status == "fail" and f"request {victim.rid} reads freed page {victim.pages[-1]}" in message


def test_alone_runs_that_differ_from_the_batch_fail_batch_invariance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nname = "m"\nmode = "full"\nworkloads = ["pair"]\n'
                    '[factors]\ncache = ["device"]\npage_size = [16]\npool = ["unified"]\n')
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    assert run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["batch_invariance"].status == "pass"
    # the alone runs (the session's solo- tenant) lose deterministic mode: same tokens, other bits
    make_engine = reference.make_engine
    monkeypatch.setattr(reference, "make_engine", lambda config: Engine(replace(config, deterministic=False))
                        if config.tenant.startswith("solo-") else make_engine(config))
    verdict = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["batch_invariance"]
    assert verdict.status == "fail" and {d["against"] for d in verdict.detail} == {"solo"}


def one_cell(tmp_path: Path, workload: str, **factors: str) -> tuple:
    lines = "\n".join(f'{name} = ["{level}"]' for name, level in factors.items())
    path = tmp_path / "m.toml"
    path.write_text(f'[matrix]\nname = "m"\nmode = "full"\nworkloads = ["{workload}"]\n[factors]\n{lines}\npage_size = [16]\n')
    matrix = load_matrix(str(path))
    return matrix, generate(matrix)[0]


def test_a_hit_lost_in_a_capped_pass_fails_cached_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """burst evicts L1 under its 256-token pool, but L2 keeps every page: the warm pass must hit everything."""
    from reference_impl.cache.host_cache import HostCache

    matrix, cell = one_cell(tmp_path, "burst", cache="host", deterministic="off")
    assert run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["cached_tokens"].status == "pass"
    monkeypatch.setattr(HostCache, "load_back", lambda self, tokens, match: match)  # L2's part of every hit is lost
    verdict = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["cached_tokens"]
    assert verdict.status == "fail" and {d["pass"] for d in verdict.detail} == {"warm"}


def test_a_head_the_store_loses_after_a_second_spill_fails_cached_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spill_rounds' third round must reload its head from L3 once L1 and L2 both dropped it."""
    from reference_impl.cache.storage_cache import StorageCache

    matrix, cell = one_cell(tmp_path, "spill_rounds", cache="storage", deterministic="off")
    assert run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["cached_tokens"].status == "pass"
    monkeypatch.setattr(StorageCache, "_below", lambda self, keys, covered: (0, set()))  # L3 never answers a read
    verdict = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["cached_tokens"]
    assert verdict.status == "fail" and ("cold", "rounds-b0") in {(d["pass"], d["request"]) for d in verdict.detail}


def test_a_hit_lost_in_a_later_round_of_the_cold_pass_fails_cached_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """templated's second round must hit the heads the first round cached (32 tokens)."""
    from reference_impl.cache.radix import RadixCache

    matrix, cell = one_cell(tmp_path, "templated", cache="device", deterministic="off")
    original = RadixCache.match_prefix

    def lose_short_hits(self, tokens):
        match = original(self, tokens)
        return original(self, tokens[:0]) if match.matched_tokens == 32 else match

    monkeypatch.setattr(RadixCache, "match_prefix", lose_short_hits)
    verdict = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["cached_tokens"]
    assert verdict.status == "fail" and {(d["pass"], d["request"]) for d in verdict.detail} == {
        ("cold", "templated-2"), ("cold", "templated-3")}
