"""pool_audit and batch_invariance seen to fire: damage planted in a real engine or run reaches the oracle.

Each pool_audit check (a leaked page, a page or slot owned twice, a freed page read) is planted in a
live engine and must come out of ``Engine.audit`` as the oracle's finding; the alone-vs-batch half of
batch_invariance must fail when the alone runs differ from the batch in any bit.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import harness.runner as runner
from fixtures.workloads import load_workload
from harness.matrix import generate
from harness.matrix_file import load_matrix
from harness.oracles import ORACLES
from harness.runner import GoldenRuns, run_cell
from reference_impl.engine.llm_engine import Engine
from tests.test_oracles import baseline, view


def warm_engine(make_engine, model: str = "dense") -> Engine:
    wl = load_workload("system_prompt")
    engine = make_engine(wl, model=model, cache="device", page_size=16)
    engine.generate(wl.requests)
    assert engine.audit() == []
    return engine


def audit_verdict(problems: list[str]) -> tuple[str, str]:
    verdict = ORACLES["pool_audit"]([view(baseline(), audit=problems)])
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
    spec = load_matrix(str(path))
    (cell,) = generate(spec)
    assert run_cell(spec, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["batch_invariance"].status == "pass"
    # the alone runs (the runner's only plain Engine) lose deterministic mode: same tokens, other bits
    monkeypatch.setattr(runner, "Engine", lambda config: Engine(replace(config, deterministic=False)))
    verdict = run_cell(spec, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["batch_invariance"]
    assert verdict.status == "fail" and {d["against"] for d in verdict.detail} == {"solo"}
