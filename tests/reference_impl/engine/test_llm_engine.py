"""Engine behaviour: rejections, preemption, priorities, cache reuse, idle integrity."""
from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.workloads import load_workload
from reference_impl.request import RequestSpec


def test_bad_requests_are_rejected_by_name_and_others_unaffected(make_engine) -> None:
    good = RequestSpec("good", (1, 2, 3, 4), max_new_tokens=4)
    bad = [
        RequestSpec("oov", (1, 999), max_new_tokens=4),
        RequestSpec("zero", (1, 2), max_new_tokens=0),
        RequestSpec("huge", tuple(range(200)) * 20, max_new_tokens=4),
        RequestSpec("good", (5, 6), max_new_tokens=4),
    ]
    alone = make_engine().generate([good])
    outs = make_engine().generate([good, *bad])
    by_rid = {}
    for o in outs:
        by_rid.setdefault(o.rid, []).append(o)
    served, duplicate = sorted(by_rid["good"], key=lambda o: o.finish_reason)
    assert duplicate.finish_reason == "rejected" and "duplicate" in duplicate.error
    assert served.tokens == alone[0].tokens
    for rid, needle in (("oov", "999"), ("zero", "max_new_tokens"), ("huge", "pages")):
        (out,) = by_rid[rid]
        assert out.finish_reason == "rejected" and rid in out.error and needle in out.error


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_preemption_under_pressure_keeps_tokens(make_engine, model: str, page_size: int) -> None:
    """Long decodes overfill the pool; recompute-preemption must not change any token."""
    burst = load_workload("burst")
    wl = replace(burst, requests=tuple(replace(r, max_new_tokens=40) for r in burst.requests[:10]))
    tight = make_engine(wl, model=model, page_size=page_size, overrides={"num_pages": 160 // page_size})
    outs = tight.generate(wl.requests)
    ample = make_engine(wl, model=model, page_size=page_size, overrides={"num_pages": 4096 // page_size})
    want = {o.rid: o.tokens for o in ample.generate(wl.requests)}
    assert tight.stats.preemptions > 0, "the pool was not tight enough to preempt"
    assert {o.rid: o.tokens for o in outs} == want
    assert tight.audit() == []


def test_priority_scheduler_runs_urgent_requests_first(make_engine) -> None:
    specs = [RequestSpec(f"r{i}", tuple(range(i, i + 30)), max_new_tokens=2, priority=5 - i) for i in range(6)]
    engine = make_engine(scheduler="priority", overrides={"max_running": 1})
    order = [o.rid for o in engine.generate(specs)]
    assert order == [f"r{i}" for i in reversed(range(6))]


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_warm_pass_hits_expected_prefix(make_engine, model: str, page_size: int) -> None:
    wl = load_workload("multi_turn")
    engine = make_engine(wl, model=model, page_size=page_size, cache="device")
    cold = {o.rid: o for o in engine.generate(wl.requests)}
    warm = {o.rid: o for o in engine.generate(wl.requests)}
    expected = wl.expected_cached(page_size=page_size, state_interval=engine.config.state_interval,
                                  hybrid=model == "hybrid", warm=True)
    assert {rid: o.cached_tokens for rid, o in warm.items()} == {rid: e.lo for rid, e in expected.items()}
    assert all(o.cached_tokens > 0 for o in warm.values())
    assert {rid: o.tokens for rid, o in warm.items()} == {rid: o.tokens for rid, o in cold.items()}
    assert engine.audit() == []


def test_priority_drop_fault_loses_a_request(make_engine) -> None:
    wl = load_workload("burst")
    engine = make_engine(wl, frozenset({"priority_scheduler_drop"}), scheduler="priority", page_size=16)
    outs = engine.generate(wl.requests)
    assert len(outs) < len(wl.requests)
    clean = make_engine(wl, scheduler="priority", page_size=16).generate(wl.requests)
    assert len(clean) == len(wl.requests)
