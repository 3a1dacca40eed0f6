"""The vLLM child compares what ``LLM.generate`` is handed before and after the call and answers the differences; the
harness reads them into the pass's result, where the ``inputs`` oracle fails the cell naming request and field.

The child's own serve runs here against a stand-in ``vllm`` module (prompts and ``SamplingParams`` as vLLM's offline
API takes them: a dict of token ids, an object of fields), whose ``LLM.generate`` changes them as told."""
from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.run.cell import run_cell
from harness.run.golden import GoldenRuns
from tests.harness.sut.vllm.stand_in import point_vllm_at
from tests.harness.sut.vllm.test_engine import PRESSED_CHILD, vllm_cell

CHILD = Path(__file__).resolve().parents[4] / "harness" / "sut" / "vllm" / "child.py"


class SamplingParams:
    """vLLM's sampling parameters as the child builds them: keyword fields on an object."""

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


class LLM:
    """``vllm.LLM`` as the child's serve uses it: ``generate`` (which runs ``change`` on its arguments first) and
    ``get_metrics``."""

    def __init__(self, change: Callable[[list, list, list], None]) -> None:
        self.change = change

    def generate(self, prompts: list, params: list, use_tqdm: bool, priority: list) -> list:
        self.change(prompts, params, priority)
        return [types.SimpleNamespace(request_id=str(i), num_cached_tokens=0, kv_transfer_params=None,
                                      outputs=[types.SimpleNamespace(token_ids=[1], logprobs=None,
                                                                     finish_reason="length")])
                for i, _ in enumerate(prompts)]

    def get_metrics(self) -> list:
        return []


@pytest.fixture
def child(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """child.py loaded here, with a stand-in ``vllm`` module."""
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams, TokensPrompt=dict))
    spec = importlib.util.spec_from_file_location("kvmatrix_test_child", CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(child: types.ModuleType, change: Callable[[list, list, list], None]) -> dict:
    engine = child.Child()
    engine.llm = LLM(change)
    requests = [{"rid": "a", "prompt": [1, 2, 3], "max_new_tokens": 1, "priority": 0},
                {"rid": "b", "prompt": [4, 5], "max_new_tokens": 1, "priority": 1}]
    return engine.serve({"op": "serve", "requests": requests, "top_logprobs": 2})["inputs"]


def changing(prompts: list, params: list, priority: list) -> None:
    prompts[0]["prompt_token_ids"].append(9)  # a prompt extended in place
    params[1].max_tokens = 7  # sampling parameters resolved in place
    priority.reverse()  # the priorities reordered


def test_the_child_answers_what_generate_changed_naming_request_and_field(child: types.ModuleType) -> None:
    answer = serve(child, changing)
    assert (answer["call"], answer["compared"]) == ("LLM.generate", 2)
    assert answer["changes"] == [
        {"request": "a", "field": "prompt.prompt_token_ids[3:]", "check": "prompt.prompt_token_ids[]", "before": "[]",
         "after": "[9]"},
        {"request": "a", "field": "priority", "check": "priority", "before": "0", "after": "1"},
        {"request": "b", "field": "sampling_params.max_tokens", "check": "sampling_params.max_tokens", "before": "1",
         "after": "7"},
        {"request": "b", "field": "priority", "check": "priority", "before": "1", "after": "0"}]


def test_a_generate_that_leaves_its_inputs_answers_no_change(child: types.ModuleType) -> None:
    answer = serve(child, lambda prompts, params, priority: None)
    assert answer["changes"] == [] and answer["compared"] == 2
    assert answer["where"] == "vLLM, in this process"


#: the stand-in child of test_engine.py, answering that vLLM extended the prompt of every request it served
CHANGED_CHILD = PRESSED_CHILD.replace('"changes": []', '"changes": [{"request": r["rid"], "field": '
                                      '"prompt.prompt_token_ids[3:]", "check": "prompt.prompt_token_ids[]", '
                                      '"before": "[]", "after": "[9]"} '
                                      'for r in msg["requests"]]')


def test_a_cell_whose_child_answers_a_change_fails_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert CHANGED_CHILD != PRESSED_CHILD
    point_vllm_at(CHANGED_CHILD, tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_UNDER_PRESSURE", "preempts")
    matrix, cell = vllm_cell(tmp_path)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    verdict = result.oracles["inputs"]
    assert verdict.status == "fail", verdict.message
    assert verdict.detail[0]["call"] == "LLM.generate" and verdict.detail[0]["field"] == "prompt.prompt_token_ids[3:]"
    assert "LLM.generate request" in verdict.message and "after the call [9]" in verdict.message


def test_a_cell_whose_child_changes_nothing_passes_inputs_saying_where(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    point_vllm_at(PRESSED_CHILD, tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_UNDER_PRESSURE", "preempts")
    matrix, cell = vllm_cell(tmp_path)
    verdict = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns()).oracles["inputs"]
    assert verdict.status == "pass", verdict.message
    assert "serve: " in verdict.message and "LLM.generate: " in verdict.message
