"""Workload expectations: rounds give the cold pass a lower bound, and the structured workloads hold their promises."""
from __future__ import annotations

from fixtures.spec_expect import NGRAM_MAX_N, prompt_lookup
from fixtures.workloads import VOCAB, load_workload
from harness.sut.reference import LEVELS
from harness.run.serve import run_workload

HIT = dict(page_size=16, state_interval=32, chunk_size=16)


def bounds(name: str, *, hybrid: bool = False, warm: bool = False, tiers: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    expected = load_workload(name).expected_cached(hybrid=hybrid, warm=warm, tiers=tiers, **HIT)
    return {rid: (e.lo, e.hi) for rid, e in expected.items()}


def test_a_later_round_must_hit_what_earlier_rounds_cached() -> None:
    # round two asks for head2 + body and head1 + other: each head was cached in round one, the chunk only after the other head
    assert bounds("templated") == {"templated-0": (0, 0), "templated-1": (0, 0),
                                   "templated-2": (32, 32), "templated-3": (32, 32)}


def test_a_head_spilled_out_of_l1_and_l2_is_reloaded_from_the_store_in_a_later_round() -> None:
    """spill_rounds: its third round must hit the head where L3 keeps it, and a real run does so from L3."""
    rounds = [rid for rid in bounds("spill_rounds") if rid.startswith("rounds-b")]
    assert all(bounds("spill_rounds", tiers=("host", "storage"))[rid] == (32, 32) for rid in rounds)
    assert all(bounds("spill_rounds", tiers=("host",))[rid] == (0, 32) for rid in rounds)
    levels = {**LEVELS.defaults, "cache": "storage", "page_size": 16}
    outputs = {o.rid: o for o in run_workload(levels, load_workload("spill_rounds"), frozenset(), "cpu").passes["cold"].outputs}
    assert outputs["rounds-b0"].cached_tokens == outputs["rounds-b0"].cached_storage == 32  # L1 and L2 both lost it


def test_a_split_inside_a_snapshot_node_leaves_the_hybrid_hit_at_the_last_snapshot() -> None:
    assert bounds("snapshot_split")["split-shared"] == (48, 48)
    assert bounds("snapshot_split", hybrid=True)["split-shared"] == (32, 32)


def test_a_capped_pool_has_a_lower_bound_only_where_a_tier_keeps_every_page() -> None:
    device, storage = bounds("burst", warm=True), bounds("burst", warm=True, tiers=("host", "storage"))
    assert all(lo == 0 for lo, _ in device.values())
    assert all(lo == hi for lo, hi in storage.values()) and any(lo > 0 for lo, _ in storage.values())


def test_starved_slots_bound_hybrid_hits_from_above_only() -> None:
    assert all(lo == 0 for lo, _ in bounds("starved_slots", hybrid=True, warm=True).values())
    assert all(lo == hi for lo, hi in bounds("starved_slots", warm=True).values())


def test_repeated_phrases_give_prompt_lookup_a_match_at_every_step() -> None:
    for request in load_workload("repeated_phrases").requests:
        assert len(set(request.prompt)) == VOCAB
        for last in range(VOCAB):  # whatever the model emits next, its token occurred before
            assert prompt_lookup((*request.prompt, last), 3)
    assert NGRAM_MAX_N == 4


def test_every_structured_workload_computes_its_own_expectations() -> None:
    for name in ("repeated_phrases", "templated", "snapshot_split", "starved_slots", "spec_preempt", "isolation",
                 "locked_prefix", "spill_rounds", "demoted_head"):
        workload = load_workload(name)
        assert workload.description and set(bounds(name)) == {r.rid for r in workload.requests}


def test_a_head_demoted_under_a_full_l2_is_kept_by_l2_with_nothing_below_it() -> None:
    """demoted_head: in the cold pass the last request hits exactly the head from L2 (host and storage alike),
    nothing with L1 alone, and a real cache=host run does; with L2 marking demoted copies oldest, it does not."""
    again = lambda tiers: load_workload("demoted_head").expected_cached(hybrid=False, warm=False, tiers=tiers, **HIT)[
        "demoted-again"]
    assert (again(("host",)).lo, again(("host",)).hi, again(("host",)).host) == (32, 32, 32)
    assert (again(("host", "storage")).lo, again(("host", "storage")).storage) == (32, 0)
    assert (again(()).lo, again(()).hi) == (0, 0)
    levels = {**LEVELS.defaults, "cache": "host", "page_size": 16}
    for faults, want in ((frozenset(), 32), (frozenset({"host_demotes_as_oldest"}), 0)):
        run = run_workload(levels, load_workload("demoted_head"), faults, "cpu")
        (out,) = [o for o in run.passes["cold"].outputs if o.rid == "demoted-again"]
        assert out.cached_tokens == out.cached_host == want
