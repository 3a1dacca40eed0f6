"""llama.cpp's server slots as its source says they grant prompt-cache hits, and every admission order a round allows.

Ported from the llama.cpp that llama-cpp-python 0.3.36 vendors (build 0c1e570), ``tools/server/``:

- **A slot holds one cached sequence**: the last prompt it served and the tokens it generated, all but the last
  (``server_slot::add_token_to_batch`` pushes each sampled token before it is decoded; the last one never is; a
  draft is capped at the tokens left, ``get_n_draft_max``, so nothing past the reply stays). ``/slots`` reports its
  length as ``n_prompt_tokens``.
- **The hit is the longest common prefix** of that sequence and the new prompt, less one when it is the whole
  prompt (``update_slots``: ``n_past = get_common_prefix``; [TAG_PROMPT_LOGITS] "need to evaluate at least 1 token";
  ``cache_prompt`` false: 0).
- **Slot choice** (``get_available_slot``, PR #7728): among idle slots that hold something, the first with the
  greatest similarity ``lcp / len(prompt)`` above ``--slot-prompt-similarity`` (0.1); if none, the least recently
  released idle slot (``t_last_used <=``: the last of equals, so a fresh server starts at the highest slot id).
- **The host prompt cache** (``--cache-ram``, PR #16391; ``server_prompt_cache`` in server-task.cpp): a slot picked
  by LRU, or by similarity keeping under half its sequence, first saves its sequence there (``alloc``: unless a
  cached one already contains it; dropping the ones it contains), then loads the cached sequence that beats its own
  in both kept fraction (at least 0.25) and similarity, scanning oldest first (``load``); a loaded one leaves it.
  With ``--cache-idle-slots`` (the default when the cache is on), starting a task saves every idle slot there too,
  and with a unified KV cache clears them ([TAG_IDLE_SLOT_CLEAR]).

The fractions are C++ ``float`` and compared as such (each rounded to float32). What the source leaves to timing is
which request of a round is admitted next and which running one finishes first: ``feasible`` tries every order, pruned
by the slot the server says each request used (``id_slot``) and, where given, by the hits it reported.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: states one judgement may visit before it gives up (the rule then says less: see ``llamacpp.py``)
MAX_STATES = 100_000
_FLOAT = struct.Struct("f")


def f32(x: float) -> float:
    """``x`` rounded to a C++ ``float`` (a quotient of two of them rounded once is what float division gives)."""
    return _FLOAT.unpack(_FLOAT.pack(x))[0]


#: llama-server's float thresholds (server-context.cpp: f_keep < 0.5f; server-task.cpp: f_keep_cur < 0.25f)
_HALF, _QUARTER = 0.5, 0.25


@dataclass(frozen=True, slots=True)
class SlotConfig:
    """How llama-server was started, as far as its slots and prompt cache go."""

    slots: int
    kv_unified: bool
    cache_ram: bool               # --cache-ram other than 0
    idle_slots: bool = True       # --cache-idle-slots (only with the host prompt cache)
    similarity: float = 0.1       # --slot-prompt-similarity (0: slots are picked by LRU alone)
    cache_prompt: bool = True     # the requests' cache_prompt


#: a server's state: per slot the sequence it holds (an index into the pass's sequences, None when empty), the
#: rank of its last release (-1: never), the request it is serving (None: idle); the host cache, oldest first.
State = tuple[tuple[int | None, ...], tuple[int, ...], tuple[str | None, ...], tuple[int, ...] | None]


def fresh(config: SlotConfig) -> State:
    """A server just started: every slot empty and never used, the host cache empty (None without one)."""
    n = config.slots
    return (None,) * n, (-1,) * n, (None,) * n, () if config.cache_ram else None


@dataclass(slots=True)
class Sequences:
    """The token sequences slots can hold (each request's prompt and reply), by index, and their common prefixes."""

    tokens: list[tuple[int, ...]] = field(default_factory=list)
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    prefixes: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, tokens: Sequence[int]) -> int:
        key = tuple(tokens)
        if key not in self.index:
            self.index[key] = len(self.tokens)
            self.tokens.append(key)
        return self.index[key]

    def lcp(self, a: int, b: int) -> int:
        """The longest common prefix of sequences ``a`` and ``b``."""
        key = (a, b) if a <= b else (b, a)
        if key not in self.prefixes:
            n = 0
            for x, y in zip(self.tokens[a], self.tokens[b]):
                if x != y:
                    break
                n += 1
            self.prefixes[key] = n
        return self.prefixes[key]

    def size(self, a: int) -> int:
        return len(self.tokens[a])


class Server:
    """The slot rules over one pass's sequences: pure functions of a ``State``, remembered once computed."""

    def __init__(self, config: SlotConfig, seqs: Sequences) -> None:
        self.config, self.seqs = config, seqs
        self.similarity = f32(config.similarity)
        self._fractions: dict[tuple[int, int], float] = {}
        self._admitted: dict[tuple[State, str, int], tuple[int, int, State]] = {}
        self._released: dict[tuple[State, int, int], State] = {}

    def fraction(self, part: int, whole: int) -> float:
        """``float(part) / whole`` in C++ float arithmetic."""
        key = (part, whole)
        if key not in self._fractions:
            self._fractions[key] = f32(part / whole)
        return self._fractions[key]

    def choose(self, state: State, prompt: int) -> tuple[int, State]:
        """``get_available_slot``: the slot a request lands on, with the host cache's save and load applied."""
        held, used, busy, ram = state
        seqs, n = self.seqs, self.seqs.size(prompt)
        chosen, update, best = None, False, 0.0
        if self.config.similarity != 0:
            for i, seq in enumerate(held):
                if busy[i] is not None or seq is None:
                    continue
                sim = self.fraction(seqs.lcp(seq, prompt), n)
                if sim > best and sim > self.similarity:
                    best, chosen = sim, i
            # about to lose most of the slot's context: keep it in the host cache
            if chosen is not None and f32(f32(best * n) / seqs.size(held[chosen])) < _HALF:
                update = True
        if chosen is None:
            last = -1
            for i in range(len(held)):
                if busy[i] is None and (chosen is None or used[i] <= last):
                    last, chosen = used[i], i
            update = True
        if update and ram is not None:
            ram = self.save(ram, held[chosen])
            loaded, ram = self.load(held[chosen], ram, prompt)
            held = held[:chosen] + (loaded,) + held[chosen + 1:]
        return chosen, (held, used, busy, ram)

    def save(self, ram: tuple[int, ...], seq: int | None) -> tuple[int, ...]:
        """``server_prompt_cache::alloc``: keep ``seq`` unless a cached sequence contains it; drop those it contains."""
        if seq is None:
            return ram
        size = self.seqs.size(seq)
        if any(self.seqs.lcp(kept, seq) == size for kept in ram):
            return ram
        return tuple(kept for kept in ram if self.seqs.lcp(kept, seq) != self.seqs.size(kept)) + (seq,)

    def load(self, seq: int | None, ram: tuple[int, ...], prompt: int) -> tuple[int | None, tuple[int, ...]]:
        """``server_prompt_cache::load``: the cached sequence that beats the slot's own in kept fraction and
        similarity (scanned oldest first), moved into the slot; else the slot's own."""
        seqs, n = self.seqs, self.seqs.size(prompt)
        common = seqs.lcp(seq, prompt) if seq is not None else 0
        keep = self.fraction(common, seqs.size(seq)) if seq is not None else -1.0
        sim, found = self.fraction(common, n), None
        for kept in ram:
            shared = seqs.lcp(kept, prompt)
            keep_here, sim_here = self.fraction(shared, seqs.size(kept)), self.fraction(shared, n)
            if keep_here < _QUARTER:
                continue
            if keep < keep_here and sim < sim_here:
                keep, sim, found = keep_here, sim_here, kept
        if found is None:
            return seq, ram
        return found, tuple(kept for kept in ram if kept != found)

    def hit(self, held: int | None, prompt: int) -> int:
        """The prompt tokens served from the slot's sequence: the common prefix, less one if it is all of it."""
        if held is None or not self.config.cache_prompt:
            return 0
        common = self.seqs.lcp(held, prompt)
        return common - 1 if common == self.seqs.size(prompt) and common > 0 else common

    def admit(self, state: State, rid: str, prompt: int) -> tuple[int, int, State]:
        """Request ``rid`` admitted now: its slot, its hit, and the state once it runs (idle slots published to the
        host cache, and cleared with a unified KV cache)."""
        key = (state, rid, prompt)
        if key in self._admitted:
            return self._admitted[key]
        slot, (held, used, busy, ram) = self.choose(state, prompt)
        got = self.hit(held[slot], prompt)
        busy = busy[:slot] + (rid,) + busy[slot + 1:]
        if ram is not None and self.config.idle_slots:
            for i, seq in enumerate(held):
                if busy[i] is None:
                    ram = self.save(ram, seq)
            if self.config.kv_unified:
                held = tuple(seq if busy[i] is not None else None for i, seq in enumerate(held))
        self._admitted[key] = slot, got, (held, used, busy, ram)
        return self._admitted[key]

    def release(self, state: State, slot: int, seq: int) -> State:
        """The request on ``slot`` finished: the slot holds its sequence and is now the most recently used."""
        key = (state, slot, seq)
        if key not in self._released:
            held, used, busy, ram = state
            others = sorted({u for i, u in enumerate(used) if u >= 0 and i != slot})
            ranks = {u: r for r, u in enumerate(others)}
            used = tuple(len(others) if i == slot else ranks.get(u, -1) for i, u in enumerate(used))
            self._released[key] = (held[:slot] + (seq,) + held[slot + 1:], used,
                                   busy[:slot] + (None,) + busy[slot + 1:], ram)
        return self._released[key]


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a round: its prompt and the sequence it leaves in its slot (indices into ``Sequences``)."""

    rid: str
    prompt: int
    leaves: int


@dataclass(slots=True)
class Budget:
    """States a judgement may still visit (shared by its checks)."""

    states: int = MAX_STATES

    def spend(self) -> bool:
        """One more state; False once none is left."""
        self.states -= 1
        return self.states >= 0


def feasible(server: Server, rounds: Sequence[Sequence[Request]], placement: Mapping[tuple[int, str], int],
             fixed: Mapping[tuple[int, str], int], budget: Budget | None = None) -> bool | None:
    """Whether some order the rounds allow (a round's requests admitted in any order, its running requests finishing
    in any order, rounds one after the other from a fresh server) lands each request on the slot ``placement`` names
    and gives each one in ``fixed`` (by round index and rid) exactly that hit; None when the ``budget`` ran out first.
    Depth first, admissions before releases: a feasible order is usually found at once; proving there is none
    visits every state."""
    budget = budget or Budget()
    by_round = [{r.rid: r for r in group} for group in rounds]
    stack = [(0, fresh(server.config), frozenset(by_round[0]) if by_round else frozenset())]
    seen: set = set()
    while stack:
        at, state, left = stack.pop()
        if (at, state, left) in seen:
            continue
        seen.add((at, state, left))
        if not budget.spend():
            return None
        busy = state[2]
        if not left and all(rid is None for rid in busy):
            if at + 1 == len(by_round):
                return True
            stack.append((at + 1, state, frozenset(by_round[at + 1])))
            continue
        requests = by_round[at]
        for slot, rid in enumerate(busy):
            if rid is not None:
                stack.append((at, server.release(state, slot, requests[rid].leaves), left))
        if all(rid is not None for rid in busy):
            continue
        for rid in sorted(left, reverse=True):
            slot, got, after = server.admit(state, rid, requests[rid].prompt)
            if placement.get((at, rid), slot) == slot and fixed.get((at, rid), got) == got:
                stack.append((at, after, left - {rid}))
    return not by_round
