"""llama.cpp's llama-server (``api = "llamacpp"``): the cache rule its cells are judged by, and what it applied.

The rule is its slots' (``slots.py``, ported from the server source of llama-cpp-python 0.3.36's vendored
llama.cpp): each slot keeps one sequence, a request lands on the most similar idle slot (PR #7728) or the least
recently used, the host prompt cache (``--cache-ram``, PR #16391) swaps whole sequences in and out, and the hit is
the slot's longest common prefix with the prompt, one prompt token always recomputed. The harness knows the
prompts, the rounds in order, each reply (what a slot keeps) and the slot each request used (``id_slot``); what it
cannot know is the order a round's concurrent requests were admitted and finished in, so every order is tried:
a request's expectation is exact where every order agrees, else the hits some order gives.

What was asked is read from the launch (llama-server's own flags and ``LLAMA_ARG_*`` variables, its defaults from
``common/common.h`` and ``tools/server/server.cpp``); what it applied from ``GET /props``, ``GET /slots`` and the
line its start logs (``load_model: initializing, n_slots = …, n_ctx_slot = …, kv_unified = '…'``).

Its proposer's rule, for ``accept_length`` to replay (``spec_rule``): ``ngram-simple`` by ``SimpleNgramRule`` with
the launch's n and m, ``draft-simple`` with the draft made here by the reference running it (``ModelRule``), over
each slot's context as ``/props`` reports it. llama-server reports neither n nor m nor the proposer's type
(``/slots`` says only whether a slot speculates; ``/props``' ``speculative.types`` is a request's default, "none"),
so those are the launch's.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fixtures.spec_expect import ModelRule, Proposer, SimpleNgramRule
from fixtures.workloads import CachedExpectation, Workload
from harness.sut.base import Applied, PassResult, Traits
from harness.models.checkpoints import DRAFT_LAYERS, SERVED_DENSE
from harness.sut.openai.slots import MAX_STATES, Budget, Request, Sequences, Server, SlotConfig, feasible
from harness.sut.openai.wire import ServerError
from harness.sut.rules import disabled

if TYPE_CHECKING:
    from harness.sut.openai.launch import Launch
    from harness.sut.openai.server import ServerProcess

#: llama-server's defaults (common/common.h: cache_ram_mib 8192, cache_idle_slots true, slot_prompt_similarity 0.1,
#: cache_prompt true; n_parallel -1 = auto, which tools/server/server.cpp turns into 4 slots with a unified KV cache)
#: and the proposers' (common_params_speculative_ngram_map: size_n 12, size_m 48; common_params_speculative_draft:
#: n_max 3, n_min 0, p_min 0)
DEFAULTS = {"parallel": -1, "kv_unified": False, "cache_ram": 8192, "idle_slots": True, "similarity": 0.1,
            "cache_prompt": True, "cache_reuse": 0, "ctx_size": 0, "ngram_n": 12, "ngram_m": 48, "model": "",
            "draft_model": "", "draft_n_max": 3, "draft_n_min": 0, "draft_p_min": 0.0}
#: flags and variables that set each of them: (flags that take a value, flags that turn it on, flags that turn it
#: off, the variable) as common/arg.cpp spells them
FLAGS = {
    "parallel": (("-np", "--parallel"), (), (), "LLAMA_ARG_N_PARALLEL"),
    "kv_unified": ((), ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified"), "LLAMA_ARG_KV_UNIFIED"),
    "cache_ram": (("-cram", "--cache-ram"), (), (), "LLAMA_ARG_CACHE_RAM"),
    "idle_slots": ((), ("--cache-idle-slots",), ("--no-cache-idle-slots",), None),
    "similarity": (("-sps", "--slot-prompt-similarity"), (), (), None),
    "cache_prompt": ((), ("--cache-prompt",), ("--no-cache-prompt",), None),
    "cache_reuse": (("--cache-reuse",), (), (), "LLAMA_ARG_CACHE_REUSE"),
    "ctx_size": (("-c", "--ctx-size"), (), (), "LLAMA_ARG_CTX_SIZE"),
    "ngram_n": (("--spec-ngram-simple-size-n",), (), (), None),
    "ngram_m": (("--spec-ngram-simple-size-m",), (), (), None),
    "model": (("-m", "--model"), (), (), "LLAMA_ARG_MODEL"),
    "draft_model": (("-md", "--model-draft", "--spec-draft-model"), (), (), "LLAMA_ARG_SPEC_DRAFT_MODEL"),
    "draft_n_max": (("--spec-draft-n-max",), (), (), "LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    "draft_n_min": (("--spec-draft-n-min",), (), (), "LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    "draft_p_min": (("--spec-draft-p-min", "--draft-p-min"), (), (), "LLAMA_ARG_SPEC_DRAFT_P_MIN"),
}
DRAFT_MODEL_FLAGS = FLAGS["draft_model"][0]
SPEC_FLAGS = ("--spec-type", *DRAFT_MODEL_FLAGS)
#: synthetic acceptance (benchmarking: drafts accepted at random, common/arg.cpp)
SYNTH_FLAGS = ("--spec-synth-len", "--spec-synth-rates", "LLAMA_ARG_SPEC_SYNTH_LEN", "LLAMA_ARG_SPEC_SYNTH_RATES")
#: GGUF architectures whose memory is a KV cache that drops a sequence's tail (``common_context_can_seq_rm``: a
#: partly accepted draft's rest is dropped): the one ``harness.models.gguf_export`` writes. A recurrent or hybrid target
#: has llama.cpp verify the accepted part again from a checkpoint (``spec_is_replay``), a step no replay models; its
#: log at the default verbosity does not say which memory it made, so the target's GGUF does
REPLAYED_ARCHITECTURES = frozenset({"llama"})
_STARTED = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'")
#: states one pass's checks of the hits a request did not report may visit in all, and each one (past them such a
#: hit counts as possible: the expectation widens, never narrows)
ALTERNATIVE_STATES, CHECK_STATES = 40_000, 4_000
RULE = "llama.cpp's slots (PR #7728, #16391; tools/server/server-context.cpp of 0c1e570)"


def asked(argv: Sequence[str], env: Mapping[str, str], request: Mapping[str, object]) -> dict[str, object]:
    """llama-server's slot and cache settings as the launch asks for them: its flags over its variables over its
    defaults; a request's ``cache_prompt`` over the server's."""
    settings = dict(DEFAULTS)
    for key, (valued, on, off, variable) in FLAGS.items():
        if variable and variable in env:
            settings[key] = _value(env[variable], DEFAULTS[key])
        for i, arg in enumerate(argv):
            if arg in valued and i + 1 < len(argv):
                settings[key] = _value(argv[i + 1], DEFAULTS[key])
            elif arg in on or arg in off:
                settings[key] = arg in on
    if "cache_prompt" in request:
        settings["cache_prompt"] = bool(request["cache_prompt"])
    settings["speculative"] = any(arg in SPEC_FLAGS and (arg != "--spec-type" or argv[i + 1] != "none")
                                  for i, arg in enumerate(argv[:-1]))
    settings["spec_types"] = _spec_types(argv, env)
    settings["synthetic"] = any(arg in SYNTH_FLAGS for arg in (*argv, *env))
    return settings


def _spec_types(argv: Sequence[str], env: Mapping[str, str]) -> frozenset[str]:
    """The proposer types asked: every ``--spec-type`` list (they add up, common/arg.cpp), else the variable's; none
    named beside a draft model, the type its GGUF names (``common_speculative_types_from_gguf``)."""
    named = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--spec-type"] or (
        [env["LLAMA_ARG_SPEC_TYPE"]] if "LLAMA_ARG_SPEC_TYPE" in env else [])
    types = frozenset(t.strip() for text in named for t in text.split(",")) - {"none", ""}
    drafts = any(arg in DRAFT_MODEL_FLAGS for arg in argv) or "LLAMA_ARG_SPEC_DRAFT_MODEL" in env
    return types or (frozenset({"the draft GGUF's"}) if drafts else frozenset())


def spec_rule(settings: Mapping[str, object], n_ctx: int | None, architecture: str | None, k: int) -> Proposer | None:
    """The rule llama-server's proposer drafts by, for ``accept_length`` to replay over each request's tokens, each
    draft cut to the slot's context ``n_ctx`` and the request's remaining tokens less one (``get_n_draft_max``):

    - ``ngram-simple`` alone: ``SimpleNgramRule`` with the n and m asked;
    - ``draft-simple`` alone with the draft made here for the dense model (``gguf_file("draft")``: its first layer):
      ``common_speculative_impl_draft_simple::draft`` takes the top token of each step's top-10 (greedy) until
      ``k`` (``--spec-draft-n-max``) or a top probability under ``p_min``, and drops a draft under ``n_min``; at the
      defaults (0, 0) that is the draft's greedy continuation, ``ModelRule`` as for vLLM's draft.

    None for any other proposer, several at once (each falls back on the next), a draft cut by ``p_min`` or
    ``n_min`` or of another length than the cell's ``k``, synthetic acceptance, or a target ``architecture`` (its
    GGUF's) not in ``REPLAYED_ARCHITECTURES``."""
    if settings["synthetic"] or architecture not in REPLAYED_ARCHITECTURES:
        return None
    if settings["spec_types"] == {"ngram-simple"}:
        return SimpleNgramRule("llama.cpp's ngram-simple (common/ngram-map.cpp common_ngram_simple_draft, "
                               "tools/server/server-context.cpp get_n_draft_max; 0c1e570)",
                               size_n=int(settings["ngram_n"]), size_m=int(settings["ngram_m"]), max_model_len=n_ctx)
    greedy = (int(settings["draft_n_max"]), int(settings["draft_n_min"]), float(settings["draft_p_min"])) == (k, 0, 0)
    if settings["spec_types"] == {"draft-simple"} and greedy and _made_here(settings):
        return ModelRule("llama.cpp's draft-simple running the draft (the dense model's first layer; "
                         "common/speculative.cpp common_speculative_impl_draft_simple, tools/server/server-context.cpp "
                         "get_n_draft_max; 0c1e570)", SERVED_DENSE, DRAFT_LAYERS, 0, within_request=True,
                         max_model_len=n_ctx)
    return None


def _made_here(settings: Mapping[str, object]) -> bool:
    """Whether the server runs the dense model's GGUF with the draft's (``harness.models.gguf_export``)."""
    from harness.models.gguf_export import gguf_file

    return (settings["model"], settings["draft_model"]) == (str(gguf_file("dense")), str(gguf_file("draft")))


def gguf_architecture(path: str) -> str | None:
    """``general.architecture`` of the GGUF at ``path``; None where it cannot be read."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _value(text: str, default: object) -> object:
    if isinstance(default, str):
        return text
    if isinstance(default, bool):
        return text.lower() in ("1", "true", "on", "enabled")
    return float(text) if isinstance(default, float) else int(text)


def slot_config(settings: Mapping[str, object], slots: int | None = None, kv_unified: bool | None = None) -> SlotConfig:
    """The slots the rule models: the settings asked, with the slot count and KV layout the server reports."""
    auto = int(settings["parallel"]) < 0  # tools/server/server.cpp: auto is 4 slots over a unified KV cache
    return SlotConfig(slots=slots or (4 if auto else int(settings["parallel"])),
                      kv_unified=kv_unified if kv_unified is not None else (auto or bool(settings["kv_unified"])),
                      cache_ram=int(settings["cache_ram"]) != 0, idle_slots=bool(settings["idle_slots"]),
                      similarity=float(settings["similarity"]), cache_prompt=bool(settings["cache_prompt"]))


@dataclass(frozen=True, slots=True)
class LlamaCppSlots:
    """llama-server's prompt cache as its source states it (``slots.py``): one sequence per slot, slot selection by
    prompt similarity (PR #7728), the host prompt cache (PR #16391), the longest common prefix less the one token
    always recomputed. A request's expectation is every hit some admission order gives it while every other request
    of the system's life so far gets the hit and the slot it reported: exact where that is one value. A band (0 up
    to the best prefix any sequence gives) where the slots cannot be modelled (``unmodelled``)."""

    config: SlotConfig
    n_ctx: int                 # the whole context, the host cache's least token limit (server_prompt_cache)
    unmodelled: str = ""       # why the slots cannot be modelled for this server (then a band)
    name: str = RULE

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        if not traits.cache.enabled or not self.config.cache_prompt:
            return disabled(workload, 1, "cache_prompt off: llama.cpp computes every prompt token")
        life = Life(Server(self.config, Sequences()))
        for pass_name in list(passes)[: list(passes).index(name) + 1]:
            life.add(workload.rounds(), passes[pass_name])
        why = self.unmodelled or self._too_long(life.server.seqs)
        return life.band(f"{self.name}, a band: {why}") if why else life.expected(self.name)

    def _too_long(self, seqs: Sequences) -> str:
        """Why the host cache might evict (its token limit is at least the whole context): then a band."""
        total = sum(len(s) for s in seqs.tokens)
        return "" if total <= self.n_ctx else f"{total} tokens of sequences may overflow the host cache's {self.n_ctx}"


class Life:
    """One system's passes so far as rounds on one server, with the hit and the slot each request reported."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rounds: list[list[Request]] = []
        self.observed: dict[tuple[int, str], int] = {}
        self.placed: dict[tuple[int, str], int] = {}
        self.last = 0  # the first round of the pass judged (the last one added)

    def add(self, rounds: Sequence[Sequence], result: PassResult) -> None:
        """A pass: each request's prompt and the sequence its reply leaves in its slot, what it reported."""
        outputs = {o.rid: o for o in result.outputs}
        self.last = len(self.rounds)
        for group in rounds:
            at = len(self.rounds)
            self.rounds.append([])
            for r in group:
                out = outputs.get(r.rid)
                reply = out.tokens[:-1] if out is not None else []
                self.rounds[at].append(Request(r.rid, self.server.seqs.add(r.prompt),
                                               self.server.seqs.add((*r.prompt, *reply))))
                if out is not None:
                    self.observed[(at, r.rid)] = out.cached_tokens
                if r.rid in result.placement:
                    self.placed[(at, r.rid)] = result.placement[r.rid]

    def expected(self, rule: str) -> dict[str, CachedExpectation]:
        """Per request of the judged pass: the hits some order gives it, the others' hits held as reported. Where
        the reported hits fit no order together, the requests whose hit no order gives even with the pass's others
        left free are the ones judged wrong (a wrong hit does not make the rest of the pass fail too); only where
        each fits alone is each judged given the others."""
        history = {k: v for k, v in self.observed.items() if k[0] < self.last}
        notes = []
        placed = self.placed
        if feasible(self.server, self.rounds, placed, {}) is False:
            placed, notes = {}, ["the slots llama.cpp reported (id_slot) fit no admission order"]
        if history and feasible(self.server, self.rounds[: self.last], placed, history) is not True:
            history = {}
            notes.append("the earlier passes' hits fit no order: not held")
        held = {**history, **{k: v for k, v in self.observed.items() if k[0] >= self.last}}
        joint = feasible(self.server, self.rounds, placed, held)
        if joint is None:
            notes.append(f"no order found fitting every reported hit within {MAX_STATES} states")
        self.budget = Budget(ALTERNATIVE_STATES)
        judged = [(at, r) for at in range(self.last, len(self.rounds)) for r in self.rounds[at]]
        if joint is False:  # some hit is wrong: the ones no order gives even with the pass's others free are
            alone = {r.rid: self._one(at, r, placed, history, None, rule, notes) for at, r in judged}
            if any(not e.admits(self.observed.get((at, r.rid), e.lo)) for (at, r), e in zip(judged, alone.values())):
                return alone
        return {r.rid: self._one(at, r, placed, held, joint, rule, notes) for at, r in judged}

    def _one(self, at: int, r: Request, placed: Mapping, held: Mapping, joint: bool | None, rule: str,
             notes: list[str]) -> CachedExpectation:
        """One request's hits over every order that keeps the others' as reported."""
        key = (at, r.rid)
        allowed, unsettled = set(), False
        for value in sorted(self._candidates(at, r) | ({held[key]} if key in held else set())):
            if joint and held.get(key) == value:
                allowed.add(value)
                continue
            check = Budget(min(CHECK_STATES, self.budget.states))
            found = feasible(self.server, self.rounds, placed, {**held, key: value}, check) if check.states else None
            self.budget.states -= min(CHECK_STATES, self.budget.states) - max(check.states, 0)
            allowed |= {value} if found is not False else set()
            unsettled |= found is None
        if unsettled:
            how = "orders not all enumerated: the hits some order may give"
        elif joint is False:
            how = "given the other requests' hits (together they fit no admission order)"
        else:
            how = "exact" if len(allowed) == 1 else "the hits some admission order gives"
        return CachedExpectation.one_of(allowed, "; ".join([f"{rule}, {how}", *notes]))

    def _candidates(self, at: int, r: Request) -> set[int]:
        """Every hit a sequence the server might hold gives ``r`` (any earlier request's, its round's others'), or 0."""
        held = [o.leaves for group in self.rounds[:at] for o in group]
        held += [o.leaves for o in self.rounds[at] if o is not r]
        return {0} | {self.server.hit(seq, r.prompt) for seq in held}

    def band(self, basis: str) -> dict[str, CachedExpectation]:
        """0 up to the best hit any sequence the server might hold gives (the slots not modelled)."""
        return {r.rid: CachedExpectation(0, max(self._candidates(at, r)), 1, basis=basis)
                for at in range(self.last, len(self.rounds)) for r in self.rounds[at]}


def read_back(props: Mapping, slots: Sequence[Mapping] | None, log: str, settings: Mapping[str, object],
              cache_on: bool) -> tuple[LlamaCppSlots, tuple[Applied, ...]]:
    """The rule for a running server and what it applied, from ``GET /props``, ``GET /slots`` (None where the server
    keeps it off) and its log, beside ``settings`` (``asked``): the slot count, the KV layout, each slot's context
    and whether its slots speculate."""
    started = _STARTED.search(log)
    config = slot_config(settings)
    n_slots = int(props.get("total_slots", config.slots))
    unified = started.group(3) == "true" if started else config.kv_unified
    per_slot = int(props.get("default_generation_settings", {}).get("n_ctx", 0)) or None
    applied = [Applied("slots", config.slots, n_slots, _defeats(config.slots, n_slots, cache_on, "which sequences stay "
                                                                "cached depends on the slot count")),
               Applied("kv_unified", config.kv_unified, unified)]
    if slots is not None:
        speculates = all(bool(slot.get("speculative")) for slot in slots) and bool(slots)
        applied.append(Applied("speculative", bool(settings["speculative"]), speculates,
                               "the cell tests speculative decoding and the server runs without it"
                               if settings["speculative"] and not speculates else ""))
    ctx_size = int(settings["ctx_size"])
    if per_slot is not None and ctx_size > 0:  # the context -c asks for, split among slots unless unified
        applied.append(Applied("n_ctx per slot", ctx_size // (1 if config.kv_unified else config.slots), per_slot))
    n_ctx = (per_slot or 0) * (1 if unified else n_slots) or int(settings["ctx_size"]) or 0
    unmodelled = (f"--cache-reuse {settings['cache_reuse']} shifts reused chunks (not modelled)"
                  if int(settings["cache_reuse"]) > 0 else "")
    return LlamaCppSlots(slot_config(settings, n_slots, unified), n_ctx, unmodelled), tuple(applied)


def _defeats(asked_value: object, used: object, matters: bool, why: str) -> str:
    return why if matters and asked_value != used else ""


def server_log(path: Path) -> str:
    """What the server printed so far."""
    return path.read_text(errors="replace") if path.is_file() else ""


def read_traits(process: ServerProcess, launch: Launch, traits: Traits, timeout_s: float) -> Traits:
    """``traits`` as a healthy llama-server applies them: its cache rule and the settings read back (``read_back``),
    its proposer's rule (``spec_rule``)."""
    props = process.call("/props", None, timeout_s, "to GET /props")
    try:
        slots = process.call("/slots", None, timeout_s, "to GET /slots")
    except ServerError:  # started with --no-slots: the slot count and context come from /props alone
        slots = None
    if not isinstance(props, dict) or not (slots is None or isinstance(slots, list)):
        raise ServerError(f"malformed response to GET /props or /slots: {str(props)[:120]}")
    settings = asked(launch.argv, launch.env, launch.request)
    rule, applied = read_back(props, slots, server_log(process.log_path), settings, traits.cache.enabled)
    per_slot = int(props.get("default_generation_settings", {}).get("n_ctx", 0)) or None
    replay = spec_rule(settings, per_slot, gguf_architecture(str(settings["model"])), traits.spec.k)
    return replace(traits, cache=replace(traits.cache, rule=rule), applied=applied,
                   spec=replace(traits.spec, replay=replay))
