"""llama.cpp's own rules as the harness judges it by them (harness/sut/openai/llamacpp.py): the settings a launch asks
for, what the server reports it applied, the cached tokens its slots imply (exact where the rule is), and the one
declared llama.cpp bug excusing the drafted tokens' 0.0 logprobs and nothing else."""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fixtures.spec_expect import ModelRule, replay_trace
from fixtures.workloads import Workload, load_workload
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.oracles import cached_tokens, logprobs
from harness.oracles.view import PassView
from harness.run.plan import plan_cell
from harness.sut.base import CacheTraits, PassResult, SpecTraits, Traits
from harness.models.checkpoints import DRAFT_LAYERS, SERVED_DENSE
from harness.sut.openai.llamacpp import (LlamaCppSlots, asked, gguf_architecture, read_back, slot_config,
                                        spec_rule)
from harness.sut.openai.slots import SlotConfig
from harness.sut.openai.wire import request_output
from harness.sut.vllm_common.spec import VLLM_LOOKUP
from reference_impl.request import RequestOutput, RequestSpec

ROOT = Path(__file__).resolve().parents[4]
SYSTEM = tuple(range(100, 120))
TRAITS = Traits(dtype=torch.float32, model="m", hybrid=False, deterministic=False, spec=SpecTraits(),
                cache=CacheTraits(enabled=True, page_size=1, chunk_size=1, state_interval=1))
#: what llama-server logs once its slots exist (server-context.cpp)
STARTED = "srv    load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'\n"


def output(rid: str, tokens: list[int], cached: int) -> RequestOutput:
    n = len(tokens)
    return RequestOutput(rid=rid, tokens=list(tokens), logprobs=[-0.5] * n, top_ids=[[t] for t in tokens],
                         top_logprobs=[[-0.5]] * n, margins=[1.0] * n, cached_tokens=cached, finish_reason="length",
                         cached_device=cached)


def test_the_settings_asked_are_the_flags_over_the_variables_over_the_defaults() -> None:
    settings = asked(["-m", "x.gguf", "-c", "8192", "-np", "2", "--spec-type", "draft-simple"],
                     {"LLAMA_ARG_N_PARALLEL": "3", "LLAMA_ARG_CACHE_RAM": "0"}, {"cache_prompt": False})
    assert (settings["parallel"], settings["cache_ram"], settings["ctx_size"]) == (2, 0, 8192)
    assert settings["cache_prompt"] is False and settings["speculative"] is True and settings["similarity"] == 0.1
    assert asked(["--spec-type", "none"], {}, {})["speculative"] is False
    # -np unset: auto, which llama-server turns into 4 slots over one unified KV cache
    assert slot_config(asked([], {}, {})) == SlotConfig(slots=4, kv_unified=True, cache_ram=True)


def test_what_the_server_applied_is_read_back_and_a_change_that_defeats_the_cell_says_so() -> None:
    props = {"total_slots": 4, "default_generation_settings": {"n_ctx": 8192}}
    slots = [{"id": i, "n_ctx": 8192, "speculative": False} for i in range(4)]
    settings = asked(["-c", "8192", "--spec-type", "draft-simple", "-md", "d.gguf"], {}, {})
    rule, applied = read_back(props, slots, STARTED, settings, cache_on=True)
    assert rule.config == SlotConfig(slots=4, kv_unified=True, cache_ram=True) and rule.n_ctx == 8192
    assert {a.what: (a.asked, a.used) for a in applied} == {
        "slots": (4, 4), "kv_unified": (True, True), "speculative": (True, False), "n_ctx per slot": (8192, 8192)}
    dropped = next(a for a in applied if a.what == "speculative")
    assert dropped.describe() == "speculative: asked True, engine used False" and "without it" in dropped.defeats
    _, applied = read_back({"total_slots": 1}, None, "", asked(["-np", "2"], {}, {}), cache_on=True)
    assert [(a.describe(), bool(a.defeats)) for a in applied] == [
        ("slots: asked 2, engine used 1", True), ("kv_unified: asked False, engine used False", False)]
    rule, _ = read_back(props, slots, STARTED, asked(["--cache-reuse", "256"], {}, {}), cache_on=True)
    assert "--cache-reuse 256" in rule.unmodelled


NGRAM = ["-c", "8192", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
         "--spec-ngram-simple-size-m", "4"]
DRAFT = ["-m", "/c/dense.gguf", "--spec-type", "draft-simple", "-md", "/c/draft.gguf", "--spec-draft-n-max", "3"]


@pytest.fixture
def made_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF exports at the paths ``DRAFT`` names (no export written)."""
    monkeypatch.setattr("harness.models.gguf_export.gguf_file", lambda name: Path(f"/c/{name}.gguf"))


def test_the_ngram_simple_proposer_is_replayed_with_the_n_and_m_asked_and_the_slots_context() -> None:
    rule = spec_rule(asked(NGRAM, {}, {}), 2048, "llama", 4)
    assert (rule.size_n, rule.size_m, rule.max_model_len, rule.within_request) == (2, 4, 2048, True)
    assert "common_ngram_simple_draft" in rule.name and "get_n_draft_max" in rule.name
    # common/common.h's defaults where the launch names neither; the type from the variable
    rule = spec_rule(asked([], {"LLAMA_ARG_SPEC_TYPE": "ngram-simple"}, {}), None, "llama", 3)
    assert (rule.size_n, rule.size_m, rule.max_model_len) == (12, 48, None)


def test_the_draft_made_here_is_replayed_greedy_by_its_one_layer(made_here: None) -> None:
    rule = spec_rule(asked(DRAFT, {}, {}), 2048, "llama", 3)
    assert isinstance(rule, ModelRule) and (rule.model, rule.layers, rule.skip) == (SERVED_DENSE, DRAFT_LAYERS, 0)
    assert (rule.within_request, rule.max_model_len) == (True, 2048) and "draft-simple" in rule.name


@pytest.mark.parametrize(("argv", "env", "architecture", "k"), [
    ([], {}, "llama", 3),                                                            # no proposer
    (["-md", "/c/draft.gguf"], {}, "llama", 3),                                      # the type the draft GGUF names
    (["--spec-type", "ngram-simple,ngram-mod"], {}, "llama", 3),                     # one falls back on the other
    (["--spec-type", "ngram-simple", "--spec-type", "ngram-map-k"], {}, "llama", 3),  # the lists add up
    (["--spec-type", "ngram-simple", "--spec-synth-len", "2.5"], {}, "llama", 3),    # synthetic acceptance
    (["--spec-type", "ngram-simple"], {}, "mamba2", 3),                              # a recurrent target
    (["--spec-type", "ngram-simple"], {}, None, 3),                                  # a GGUF not read
    ([*DRAFT, "--spec-draft-p-min", "0.5"], {}, "llama", 3),                         # a draft cut by probability
    (DRAFT, {"LLAMA_ARG_SPEC_DRAFT_N_MIN": "2"}, "llama", 3),                        # ... or dropped under n_min
    (DRAFT, {}, "llama", 4),                                                         # k other than n_max
    (["-m", "/c/dense.gguf", "--spec-type", "draft-simple", "-md", "/c/x.gguf"], {}, "llama", 3),  # not made here
])
def test_no_replay_for_a_proposer_whose_drafts_the_tokens_do_not_settle(argv, env, architecture, k,
                                                                         made_here: None) -> None:
    assert spec_rule(asked(argv, env, {}), 2048, architecture, k) is None


def test_the_architecture_is_read_from_the_targets_gguf(tmp_path: Path) -> None:
    from harness.models.gguf_export import gguf_file

    assert gguf_architecture(str(gguf_file("dense"))) == "llama"
    (tmp_path / "x.gguf").write_bytes(b"not a gguf")
    assert gguf_architecture(str(tmp_path / "x.gguf")) is None and gguf_architecture(str(tmp_path / "y")) is None


def system_prompt() -> Workload:
    """Two requests on one 20-token head, one after the other."""
    return Workload("two", "", (RequestSpec("a", SYSTEM + (1, 2), 3), RequestSpec("b", SYSTEM + (3, 4), 3)),
                    round_sizes=(1, 1))


def test_one_slot_hits_exactly_the_prefix_its_one_sequence_shares() -> None:
    """One slot keeps only the last sequence: the warm pass's "a" hits the 20 tokens b's left, not the 22 of its
    own prompt a radix cache would keep; a repeated prompt hits all of it but the one token recomputed."""
    rule = LlamaCppSlots(SlotConfig(slots=1, kv_unified=False, cache_ram=False), n_ctx=8192)
    cold = PassResult(outputs=[output("a", [5, 6, 7], 0), output("b", [8, 9, 9], 20)], placement={"a": 0, "b": 0})
    warm = PassResult(outputs=[output("a", [5, 6, 7], 20), output("b", [8, 9, 9], 20)], placement={"a": 0, "b": 0})
    got = rule.expected(system_prompt(), TRAITS, "warm", {"cold": cold, "warm": warm})
    assert {rid: (e.values, e.exact) for rid, e in got.items()} == {"a": ((20,), True), "b": ((20,), True)}
    assert got["a"].basis.endswith(", exact")
    again = Workload("again", "", (RequestSpec("a", SYSTEM, 2),))
    warm_again = {"cold": PassResult(outputs=[output("a", [5, 6], 0)]),
                  "warm": PassResult(outputs=[output("a", [5, 6], 19)])}
    assert rule.expected(again, TRAITS, "warm", warm_again)["a"].values == (19,)
    off = LlamaCppSlots(SlotConfig(slots=1, kv_unified=False, cache_ram=False, cache_prompt=False), n_ctx=8192)
    assert {e.describe() for e in off.expected(again, TRAITS, "warm", warm_again).values()} == {"0"}


def test_the_cached_tokens_oracle_judges_a_llamacpp_cell_by_the_slot_rule() -> None:
    """Exact where every admission order agrees: a hit one token off fails, naming llama.cpp's rule."""
    rule = LlamaCppSlots(SlotConfig(slots=1, kv_unified=False, cache_ram=False), n_ctx=8192)
    cold = PassResult(outputs=[output("a", [5, 6, 7], 0), output("b", [8, 9, 9], 20)], placement={"a": 0, "b": 0})
    warm = PassResult(outputs=[output("a", [5, 6, 7], 21), output("b", [8, 9, 9], 20)], placement={"a": 0, "b": 0})
    workload = system_prompt()
    views = [PassView(workload="two", name=name, requests=workload.requests, got=result, traits=TRAITS,
                      references={"golden": cold},
                      expected_cached=rule.expected(workload, TRAITS, name, {"cold": cold, "warm": warm}))
             for name, result in (("cold", cold), ("warm", warm))]
    v = cached_tokens.ORACLE(views)
    assert v.status == "fail" and len(v.detail) == 1
    assert (v.detail[0]["pass"], v.detail[0]["request"], v.detail[0]["expected"], v.detail[0]["got"]) == (
        "warm", "a", "20", "21")
    assert "llama.cpp's slots (PR #7728, #16391" in v.message
    assert v.detail[0]["rule"].startswith("llama.cpp's slots") and v.detail[0]["rule"].endswith(", exact")
    warm.outputs[0].cached_tokens = warm.outputs[0].cached_device = 20
    views[1] = PassView(workload="two", name="warm", requests=workload.requests, got=warm, traits=TRAITS,
                        references={"golden": cold},
                        expected_cached=rule.expected(workload, TRAITS, "warm", {"cold": cold, "warm": warm}))
    v = cached_tokens.ORACLE(views)
    assert v.status == "pass" and "4 of 4 requests judged exactly" in v.message


def test_the_llamacpp_matrix_declares_no_cached_tokens_failure() -> None:
    """The slot rule is an expectation: no declaration of either llama.cpp matrix excuses cached_tokens."""
    for name in ("llamacpp", "llamacpp_smoke"):
        matrix = load_matrix(str(ROOT / "matrices" / f"{name}.toml"))
        assert matrix.expected and all("cached_tokens" not in entry.fails for entry in matrix.expected)


#: a llama-server /completion reply under speculative decoding, as server-task.cpp writes it (return_tokens,
#: n_probs 2): the first token decoded alone with its top logprobs, then one verify step's three tokens without any
STAND_IN = {
    "tokens": [7, 9, 4, 4], "stop_type": "limit", "id_slot": 0,
    "timings": {"cache_n": 0, "draft_n": 3, "draft_n_accepted": 2},
    "completion_probabilities": [
        {"id": 7, "logprob": -0.25, "top_logprobs": [{"id": 7, "logprob": -0.25}, {"id": 3, "logprob": -2.5}]},
        {"id": 9, "logprob": 0.0, "top_logprobs": []},
        {"id": 4, "logprob": 0.0, "top_logprobs": []},
        {"id": 4, "logprob": 0.0, "top_logprobs": []}]}
SERVER = {"api": "llamacpp", "cached_tokens": "timings.cache_n", "counters": {}}


@pytest.fixture(scope="module")
def spec_known() -> tuple:
    """The known failures matrices/llamacpp.toml declares for its spec cells, as a cell's plan applies them."""
    matrix = load_matrix(str(ROOT / "matrices" / "llamacpp.toml"))
    cell = next(c for c in generate(matrix) if c.as_dict()["spec"] == "draft")
    return plan_cell(matrix, cell, frozenset()).known


def judge_logprobs(doc: dict, known: tuple) -> object:
    request = RequestSpec("r", SYSTEM, 4)
    reply = request_output(SERVER, request, doc, counted=False)
    golden = copy.deepcopy(reply.output)
    golden.logprobs = [-0.25, -0.75, -1.5, -0.5]
    got = PassResult(outputs=[reply.output], verified={"r": reply.verified})
    return logprobs.ORACLE([PassView(workload="w", name="cold", requests=(request,), got=got, traits=TRAITS,
                                     references={"golden": PassResult(outputs=[golden])}, known=known)])


def test_the_drafted_tokens_zero_logprob_is_excused_and_a_planted_error_elsewhere_fails(spec_known: tuple) -> None:
    v = judge_logprobs(STAND_IN, spec_known)
    assert v.status == "pass" and v.excused == {1: 3}  # the verify step's three tokens, as declared
    planted = copy.deepcopy(STAND_IN)
    planted["completion_probabilities"][0]["logprob"] = -1.25  # the token decoded alone: not a drafted one
    v = judge_logprobs(planted, spec_known)
    assert v.status == "fail" and len(v.detail) == 1
    assert (v.detail[0]["step"], v.detail[0]["got"], v.detail[0]["token"]) == (0, -1.25, "sampled")
    wrong_draft = copy.deepcopy(STAND_IN)
    wrong_draft["completion_probabilities"][2]["logprob"] = -9.0  # a drafted token, but not the declared 0.0
    v = judge_logprobs(wrong_draft, spec_known)
    assert v.status == "fail" and (v.detail[0]["step"], v.detail[0]["token"]) == (2, "drafted")
    sampled_zero = copy.deepcopy(STAND_IN)
    sampled_zero["completion_probabilities"][0]["logprob"] = 0.0  # 0.0 on a sampled token is not the declared bug
    assert judge_logprobs(sampled_zero, spec_known).status == "fail"


# -- a live llama-server's answers (tests/data/servers/llamacpp/, captured: see its README) --------------------------

RECORDED = ROOT / "tests" / "data" / "servers" / "llamacpp"


def recorded(name: str) -> object:
    return json.loads((RECORDED / name).read_text())


def test_a_recorded_server_reads_back_what_it_applied() -> None:
    """llama-server capped each slot's context at the model's training context: shown as a change, harmless."""
    settings = asked(recorded("argv.json"), {}, {"cache_prompt": True})
    rule, applied = read_back(recorded("props.json"), recorded("slots.json"), (RECORDED / "server.log").read_text(),
                              settings, cache_on=True)
    assert rule.config == SlotConfig(slots=2, kv_unified=False, cache_ram=True)
    assert [(a.describe(), a.defeats) for a in applied] == [
        ("slots: asked 2, engine used 2", ""), ("kv_unified: asked False, engine used False", ""),
        ("speculative: asked True, engine used True", ""), ("n_ctx per slot: asked 4096, engine used 2048", "")]


def recorded_pass() -> tuple[Workload, dict[str, PassResult], list]:
    """The two recorded requests as one pass of two rounds, read as the harness reads a reply."""
    requests, replies = [], []
    for i in (0, 1):
        body = recorded(f"request{i}.json")
        requests.append(RequestSpec(f"r{i}", tuple(body["prompt"]), body["n_predict"]))
        replies.append(request_output({**SERVER, "api": "llamacpp"}, requests[-1], recorded(f"completion{i}.json")))
    result = PassResult(outputs=[r.output for r in replies], placement={r.output.rid: r.slot for r in replies},
                        verified={r.output.rid: r.verified for r in replies})
    return Workload("recorded", "", tuple(requests), round_sizes=(1, 1)), {"cold": result}, replies


def test_the_slot_rule_predicts_the_recorded_hits_exactly() -> None:
    workload, passes, replies = recorded_pass()
    rule, _ = read_back(recorded("props.json"), recorded("slots.json"), (RECORDED / "server.log").read_text(),
                        asked(recorded("argv.json"), {}, {"cache_prompt": True}), cache_on=True)
    got = rule.expected(workload, TRAITS, "cold", passes)
    assert [r.output.cached_tokens for r in replies] == [0, 262] and [r.slot for r in replies] == [1, 1]
    assert {rid: (e.values, e.exact) for rid, e in got.items()} == {"r0": ((0,), True), "r1": ((262,), True)}


def test_a_logprob_error_planted_on_a_recorded_sampled_token_fails_the_spec_cell(spec_known: tuple) -> None:
    """Golden is the recorded reply with a model's logprob (a stand-in: -0.5) where llama.cpp returned 0.0: the
    declaration excuses every drafted 0.0; the same error planted on the one sampled token fails the cell."""
    workload, passes, replies = recorded_pass()
    got = passes["cold"]
    golden = copy.deepcopy(got.outputs)
    for out, reply in zip(golden, replies):
        out.logprobs = [-0.5 if step in reply.verified else lp for step, lp in enumerate(out.logprobs)]
    assert all(r.verified == tuple(range(1, 32)) for r in replies)  # every token but the first came from a verify step

    def judge() -> object:
        return logprobs.ORACLE([PassView(workload="recorded", name="cold", requests=workload.requests, got=got,
                                         traits=TRAITS, references={"golden": PassResult(outputs=golden)},
                                         known=spec_known)])

    v = judge()
    assert v.status == "pass" and v.excused == {1: 62}
    got.outputs[1].logprobs[0] -= 0.5  # the token r1 sampled alone
    v = judge()
    assert v.status == "fail" and [(f["request"], f["step"], f["token"]) for f in v.detail] == [("r1", 0, "sampled")]


#: passes recorded from llama-server (tests/data/llamacpp/README.md)
PASSES = ROOT / "tests" / "data" / "llamacpp"


@pytest.fixture
def recorded_ggufs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF exports as a recording names them (``{gguf}``, ``{draft_gguf}``: scripts/record-llamacpp-pass)."""
    monkeypatch.setattr("harness.models.gguf_export.gguf_file",
                        lambda name: Path("{gguf}" if name == "dense" else "{draft_gguf}"))


@pytest.mark.parametrize("name", ["ngram_repeated_phrases.json", "ngram1_repeated_phrases.json",
                                  "draft_repeated_phrases.json", "draft_system_prompt.json"])
def test_recorded_llama_server_counters_equal_the_replay_and_a_count_off_it_fails(name: str, recorded_ggufs) -> None:
    """llama-server's own counters (/metrics) equal its proposer replayed over each recorded pass's tokens (n-gram
    lookup, the one-layer draft); golden counting the same, an accepted token fewer, a draft more or a draft token
    fewer fails the replay alone."""
    from tests.harness.oracles.test_accept_length import ORACLES, served_view

    record = json.loads((PASSES / name).read_text())
    rule = spec_rule(asked(record["argv"], {}, {}), record["n_ctx_slot"], "llama", record["k"])
    assert rule is not None
    for pass_name, served in record["passes"].items():
        counted = served["counters"]

        def judge(counters: dict[str, int]) -> object:
            return ORACLES["accept_length"]([served_view(record["workload"], served["outputs"], counters,
                                                         record["levels"]["spec"], record["k"], rule, pass_name)])

        verdict = judge(counted)
        assert verdict.status == "pass" and "1 of 1 passes replayed" in verdict.message, verdict.message
        for what, by in (("accepted_tokens", -1), ("drafts", 1), ("draft_tokens", -1)):
            verdict = judge({**counted, what: counted[what] + by})
            assert verdict.status == "fail" and [(f["check"], f["what"]) for f in verdict.detail] == \
                [("replay", what)], verdict.message


def test_the_recorded_ngram_counters_are_llama_cpps_rule_not_prompt_lookups(recorded_ggufs) -> None:
    """n = 1, m = 6 over repeated phrases of period 5: prompt lookup of the same n, which also copies the token just
    sampled, drafts 2 tokens more and accepts 2 more than llama-server counted; ngram-simple's history-only copy is
    what it counted."""
    record = json.loads((PASSES / "ngram1_repeated_phrases.json").read_text())
    served, workload = record["passes"]["cold"], load_workload(record["workload"])
    lookup = replace(VLLM_LOOKUP, min_n=1, max_n=1, earliest=False, within_request=True, max_model_len=None)
    for rule, want in ((spec_rule(asked(record["argv"], {}, {}), 2048, "llama", 6), served["counters"]),
                       (lookup, {"drafts": 96, "draft_tokens": 536, "accepted_tokens": 26})):
        traces = [replay_trace(r.prompt, served["outputs"][r.rid], 6, r.max_new_tokens, rule)
                  for r in workload.requests]
        assert {"drafts": sum(d > 0 for t in traces for d in t.drafted), "draft_tokens": sum(sum(t.drafted) for t in
                traces), "accepted_tokens": sum(sum(t.accepted) for t in traces)} == want
