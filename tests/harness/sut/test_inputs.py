"""The caller's inputs as an engine must leave them: snapshots that share nothing, every engine's ``serve`` watched, and
the ``inputs`` oracle failing an engine that changes what it was handed, naming the request and the field."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fixtures.workloads import load_workload
from harness.oracles import inputs as inputs_oracle
from harness.run.judge import pass_views
from harness.run.serve import run_workload
from harness.sut import reference
from harness.sut.base import PassResult, Totals
from harness.sut.inputs import ABSENT, CALL, InputsCheck, Watch, differences, snapshot
from harness.sut.watched import WatchedSystem
from reference_impl.engine.llm_engine import Engine
from reference_impl.request import RequestOutput, RequestSpec


@dataclass
class Params:
    """A stand-in for sampling parameters: a field, a private one an engine might resolve, a nested mapping."""

    max_tokens: int
    _stop: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


class Struct:
    """A stand-in for a msgspec struct (vLLM's ``SamplingParams``): fields named by ``__struct_fields__``, no dict."""

    __struct_fields__ = ("temperature", "output_kind")
    __slots__ = __struct_fields__

    def __init__(self) -> None:
        self.temperature, self.output_kind = 0.0, 1


def test_a_snapshot_shares_nothing_with_what_it_was_taken_of() -> None:
    params = Params(4, extra={"kv": {"ids": [1, 2]}})
    taken = snapshot({"prompt": [1, 2, 3], "params": params, "struct": Struct(), "tags": {"b", "a"}})
    params.extra["kv"]["ids"].append(3)
    params._stop.append(7)
    assert taken == {"prompt": [1, 2, 3], "params": {"max_tokens": 4, "_stop": [], "extra": {"kv": {"ids": [1, 2]}}},
                     "struct": {"temperature": 0.0, "output_kind": 1}, "tags": ["a", "b"]}


def test_differences_name_the_deepest_field_and_where_a_list_was_cut() -> None:
    before = {"prompt": [5, 6, 7, 8], "params": {"max_tokens": 4, "extra": {"kv": 1}}}
    after = {"prompt": [5, 6], "params": {"max_tokens": 9, "extra": {}}}
    assert differences(before, after) == [("prompt[2:]", [7, 8], []), ("params.max_tokens", 4, 9),
                                          ("params.extra.kv", 1, ABSENT)]
    assert differences(before, {**before}) == []


def test_a_watch_sees_an_item_replaced_in_the_callers_list() -> None:
    prompts = [[1, 2], [3, 4]]
    watch = Watch(lambda: {"a": prompts[0], "b": prompts[1]})
    prompts[1] = [3, 5]  # a new list put in the caller's, not the old one changed
    assert watch.changes() == [{"request": "b", "field": "[1]", "check": "[]", "before": "4", "after": "5"}]


class Reversing:
    """A system that serves nothing and reverses the round it is handed, in place."""

    traits = None

    def serve(self, rounds: Sequence[list[RequestSpec]]) -> PassResult:
        rounds[0].reverse()
        return PassResult(outputs=[])

    def totals(self) -> Totals:
        return Totals(stats={})

    def close(self) -> None:
        pass


def test_serve_is_watched_for_requests_dropped_added_or_reordered() -> None:
    group = [RequestSpec("a", (1,), 1), RequestSpec("b", (2,), 1)]
    result = WatchedSystem(Reversing()).serve([group])
    (check,) = result.inputs
    assert (check.call, check.compared) == ("serve", 2)
    assert check.changes == [
        {"request": "a", "field": "rid", "check": "rid", "before": "'a'", "after": "'b'"},
        {"request": "a", "field": "prompt[0]", "check": "prompt[]", "before": "1", "after": "2"},
        {"request": "b", "field": "rid", "check": "rid", "before": "'b'", "after": "'a'"},
        {"request": "b", "field": "prompt[0]", "check": "prompt[]", "before": "2", "after": "1"},
        {"request": CALL, "field": "rounds[0][0]", "check": "rounds[][]", "before": "'a'", "after": "'b'"},
        {"request": CALL, "field": "rounds[0][1]", "check": "rounds[][]", "before": "'b'", "after": "'a'"}]


class Truncating(Engine):
    """The reference engine, changed to cut each request's prompt to its first 8 tokens in place after serving it
    (the frozen request written through ``object.__setattr__``, as a C extension or a careless subclass can)."""

    def generate(self, specs: Sequence[RequestSpec]) -> list[RequestOutput]:
        outputs = super().generate(specs)
        for spec in specs:
            object.__setattr__(spec, "prompt", spec.prompt[:8])
        return outputs


def test_an_engine_that_changes_a_request_fails_inputs_naming_the_request_and_field(monkeypatch) -> None:
    monkeypatch.setattr(reference.engine, "make_engine", lambda config: Truncating(config))
    workload = load_workload("pair")
    lengths = {r.rid: len(r.prompt) for r in workload.requests}
    run = run_workload({}, workload, frozenset())
    verdict = inputs_oracle.judge(pass_views(run, {"golden": run}, {}))
    assert verdict.status == "fail", verdict.message
    first = verdict.detail[0]
    assert (first["workload"], first["pass"], first["call"]) == ("pair", "cold", "serve")
    assert first["field"] == "prompt[8:]" and first["after"] == "[]" and first["request"] in lengths
    assert first["before"].count(",") == lengths[first["request"]] - 9  # the cut tail, before
    assert "request pair-" in verdict.message and "prompt[8:]" in verdict.message


def test_the_reference_engine_leaves_its_inputs_and_says_what_was_compared() -> None:
    run = run_workload({"cache": "device", "pd": "inproc"}, load_workload("pair"), frozenset())
    verdict = inputs_oracle.judge(pass_views(run, {"golden": run}, {}))
    assert verdict.status == "pass", verdict.message
    assert "serve: 6 requests" in verdict.message  # cold, warm, and each request alone (deterministic mode)


def test_nothing_compared_is_a_skip_not_a_pass() -> None:
    run = run_workload({}, load_workload("pair"), frozenset())
    for result in (*run.passes.values(), run.solo):
        result.inputs.clear()
    assert inputs_oracle.judge(pass_views(run, {"golden": run}, {})).status == "skip"


def test_a_check_from_a_childs_answer_is_read_back_or_refused_naming_the_field() -> None:
    doc = {"call": "LLM.generate", "where": "a child", "compared": 2, "changes": [{"request": "a"}]}
    assert InputsCheck.from_json(doc).to_json() == doc
    try:
        InputsCheck.from_json({**doc, "compared": "2"})
    except ValueError as exc:
        assert "'compared'" in str(exc)
    else:
        raise AssertionError("a malformed check was read back")
