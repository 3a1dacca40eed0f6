"""Shrinking a workload on a synthetic interestingness test: requests, rounds, decoded tokens and token runs, with
shared prefixes cut in every prompt that shares them at once."""
from __future__ import annotations

import dataclasses

from fixtures.workloads import Workload, load_workload
from harness.repro.ddmin import Budget
from harness.repro.shrink import Draft, Shrinker, Size, halve, segments
from reference_impl.request import RequestSpec

HEAD = tuple(range(100, 116))


def workload(rounds: tuple[int, ...] = ()) -> Workload:
    """Six requests on one 16-token head, each with a tail of its own; request 3 carries token 7 in its tail."""
    requests = tuple(RequestSpec(f"r{i}", HEAD + tuple(range(10 * i + 1, 10 * i + 11)), max_new_tokens=8, priority=i)
                     for i in range(6))
    return Workload("synthetic", "test", requests, round_sizes=rounds, head=HEAD, tails=frozenset({"r1", "r3"}))


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def needs_pair_and_token(w: Workload) -> bool:
    """Fails while some request holds token 31 and another request shares at least 4 prompt tokens with it."""
    holders = [r for r in w.requests if 31 in r.prompt]
    return any(shared(h.prompt, r.prompt) >= 4 for h in holders for r in w.requests if r is not h)


def test_segments_cut_where_the_sharing_prompts_change() -> None:
    prompts = [(1, 2, 3, 4, 5), (1, 2, 3, 9), (7, 8)]
    cuts = {(s.start, s.end, s.path) for s in segments(prompts)}
    assert cuts == {(0, 3, (1, 2, 3)), (3, 5, (1, 2, 3, 4, 5)), (3, 4, (1, 2, 3, 9)), (0, 2, (7, 8))}
    assert segments(prompts)[0].path == (1, 2, 3)  # longest first
    assert {(s.start, s.end) for s in segments([(1, 2, 3, 4)], head=(1, 2))} == {(0, 2), (2, 4)}


def test_halve_drops_a_run_or_keeps_the_half_that_fails() -> None:
    assert halve(tuple(range(16)), lambda t: 11 in t) == (11,)
    assert halve((1, 2, 3), lambda t: True) == ()
    assert halve(tuple(range(8)), lambda t: len(t) >= 3) == (0, 1, 2, 3)


def test_shrinker_keeps_the_shared_prefix_the_failure_needs_and_drops_the_rest() -> None:
    original = workload()
    runs: list[Workload] = []

    def fails(w: Workload) -> bool:
        runs.append(w)
        return needs_pair_and_token(w)

    shrunk = Shrinker(original, fails, Budget(200)).run()
    w = shrunk.workload
    assert needs_pair_and_token(w) and shrunk.runs == len(runs) <= 200
    assert shrunk.after.requests == 2 and [r.max_new_tokens for r in w.requests] == [1, 1]
    holder = next(r for r in w.requests if 31 in r.prompt)
    other = next(r for r in w.requests if r is not holder)
    assert shared(holder.prompt, other.prompt) >= 4 and shrunk.after.prompt_tokens < 12
    assert shrunk.after.smaller_than(shrunk.before) and w.name == "synthetic.shrunk"
    assert w.tails <= original.tails and {r.rid for r in w.requests} >= w.tails


def test_shrinker_merges_rounds_and_narrows_the_workload_settings() -> None:
    original = workload(rounds=(2, 2, 2))
    shrunk = Shrinker(original, needs_pair_and_token, Budget(200)).run().workload
    assert shrunk.round_sizes == () and len(shrunk.rounds()) == 1
    draft = Draft.of(original).keep([0, 1, 4])
    assert draft.workload(original, "x").round_sizes == (2, 1)


def test_shrinker_stops_at_its_budget_with_a_failing_workload() -> None:
    shrunk = Shrinker(workload(), needs_pair_and_token, Budget(5)).run()
    assert shrunk.runs == 5 and needs_pair_and_token(shrunk.workload)


def test_an_untouched_registered_workload_keeps_its_size() -> None:
    burst = load_workload("burst")
    same = Draft.of(burst).workload(burst, "burst")
    assert same == burst and Size.of(same) == Size.of(burst)
    assert dataclasses.replace(burst, name="b") != burst
