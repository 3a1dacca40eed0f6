"""llama.cpp's slot rules (harness/sut/openai/slots.py) as its server source states them: the hit, slot choice by
similarity or LRU, the host prompt cache, and the search over the admission orders a round allows."""
from __future__ import annotations

from harness.sut.openai.slots import Budget, Request, Sequences, Server, SlotConfig, feasible, fresh

SYSTEM = tuple(range(100, 120))  # a 20-token shared head


def server(slots: int = 2, *, cache_ram: bool = False, kv_unified: bool = False, similarity: float = 0.1,
           cache_prompt: bool = True) -> Server:
    return Server(SlotConfig(slots=slots, kv_unified=kv_unified, cache_ram=cache_ram, similarity=similarity,
                             cache_prompt=cache_prompt), Sequences())


def test_the_hit_is_the_common_prefix_less_the_one_token_always_recomputed() -> None:
    s = server()
    held = s.seqs.add(SYSTEM + (1, 2, 7, 8))          # a finished request: its prompt and its reply but the last token
    assert s.hit(held, s.seqs.add(SYSTEM + (1, 9))) == 21
    assert s.hit(held, s.seqs.add(SYSTEM + (1, 2))) == 21  # the whole prompt is held: one token is recomputed
    assert s.hit(None, s.seqs.add(SYSTEM)) == 0
    assert server(cache_prompt=False).hit(held, s.seqs.add(SYSTEM + (1, 9))) == 0


def test_a_fresh_server_starts_at_the_highest_slot_and_similarity_picks_the_slot_that_shares_most() -> None:
    s = server(3)
    first, second = s.seqs.add(SYSTEM + (1,)), s.seqs.add(SYSTEM + (1, 5))
    slot, state = s.choose(fresh(s.config), first)
    assert slot == 2  # every slot never used: the last of equals (t_last_used <=)
    state = s.release(s.admit(state, "a", first)[2], 2, s.seqs.add(SYSTEM + (1, 4)))
    assert s.choose(state, second)[0] == 2  # 21 of 22 tokens in common: above the similarity threshold
    other = s.seqs.add((7,) * 30)
    assert s.choose(state, other)[0] == 1  # nothing in common: the least recently used idle slot
    lru = Server(SlotConfig(slots=3, kv_unified=False, cache_ram=False, similarity=0.0), s.seqs)
    assert lru.choose(state, second)[0] == 1  # similarity off: LRU alone


def test_the_host_cache_gives_back_a_sequence_its_slot_lost() -> None:
    """One slot with --cache-ram: a request sharing nothing saves the slot's sequence to the host cache; the next
    request like the first loads it back and hits it (without the host cache it would hit nothing)."""
    for cache_ram, want in ((True, 21), (False, 0)):
        s = server(1, cache_ram=cache_ram)
        state = fresh(s.config)
        for rid, prompt, leaves in (("a", SYSTEM + (1,), SYSTEM + (1, 5)), ("b", (9,) * 40, (9,) * 42)):
            slot, _, state = s.admit(state, rid, s.seqs.add(prompt))
            state = s.release(state, slot, s.seqs.add(leaves))
        assert s.admit(state, "c", s.seqs.add(SYSTEM + (1, 6)))[1] == want


def test_the_search_finds_an_order_that_fits_the_reported_hits_and_proves_none_fits_a_wrong_one() -> None:
    s = server(2)
    a = Request("a", s.seqs.add(SYSTEM + (1,)), s.seqs.add(SYSTEM + (1, 5)))
    b = Request("b", s.seqs.add(SYSTEM + (2,)), s.seqs.add(SYSTEM + (2, 6)))
    c = Request("c", s.seqs.add(SYSTEM + (1, 5, 3)), s.seqs.add(SYSTEM + (1, 5, 3, 4)))
    rounds = [[a, b], [c]]
    assert feasible(s, rounds, {}, {(1, "c"): 22}) is True   # c lands on a's slot and hits all a left
    assert feasible(s, rounds, {}, {(1, "c"): 21}) is False  # no order gives 21 of 23: what a left, or b's 20
    # b admitted once a finished picks a's slot (20 of 21 in common) and overwrites it: c then hits b's 20...
    assert feasible(s, rounds, {}, {(1, "c"): 20}) is True
    # ...which the slots llama.cpp reported (a on 1, b on 0: both kept) rule out
    assert feasible(s, rounds, {(0, "a"): 1, (0, "b"): 0}, {(1, "c"): 20}) is False
    assert feasible(s, rounds, {(0, "a"): 1, (0, "b"): 0}, {(1, "c"): 22}) is True
    assert feasible(s, rounds, {(0, "a"): 1, (0, "b"): 0, (1, "c"): 0}, {}) is False  # c goes where a's prefix is
    assert feasible(s, rounds, {}, {(1, "c"): 22}, Budget(1)) is None  # out of states: undecided, never "no"
