"""The checks a reproducer script carries: each judges plain runs as its oracle does, and the exit status says
whether the failure shows (1), does not (0), or a run raised something else (2). They import nothing of kvmatrix."""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from harness.models import weights
from harness.sut.host import KERNEL_FLAGS, cpu_flags
from harness.sut.reference import standalone as reference_standalone
from harness.sut.script import checks
from harness.sut.script.text import assemble
from harness.sut.vllm import standalone as vllm_standalone

AMX_XEON = "processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8\n"
AMD_EPYC = "processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 avx512_vnni\n"


def output(rid: str, tokens: list[int], **extra) -> dict:
    return {"rid": rid, "tokens": tokens, "logprobs": [-0.5] * len(tokens), "margins": [1.0] * len(tokens),
            "cached_tokens": 0, "cached_host": 0, "cached_storage": 0, "finish_reason": "length", "accepted": [],
            "drafted": [], **extra}


def run(*outputs: dict, raised: str | None = None, audit: tuple[str, ...] = (), nan_events: int = 0) -> dict:
    one = {"outputs": list(outputs), "audit": list(audit), "nan_events": nan_events}
    return {"raised": raised, "passes": {"cold": one, "warm": one}}


CHECK = {"oracle": "completeness", "check": None, "passes": ["cold"], "requested": {"a": 2, "b": 2}}


def test_completeness_sees_a_lost_request_and_a_short_one() -> None:
    expected, got, present = checks.judge_completeness(CHECK, run(output("a", [1, 2])), run())
    assert present and "b: never finished (lost)" in got and "a 2, b 2" in expected
    assert checks.judge_completeness(CHECK, run(output("a", [1]), output("b", [1, 2])), run())[2]
    assert not checks.judge_completeness(CHECK, run(output("a", [1, 2]), output("b", [3, 4])), run())[2]


def test_tokens_compare_with_the_toggled_run_and_skip_a_tie() -> None:
    check = {"oracle": "tokens", "passes": ["cold"], "tie": 0.01}
    want = run(output("a", [1, 2, 3]))
    assert checks.judge_tokens(check, run(output("a", [1, 9, 3])), want)[2]
    tie = run(output("a", [1, 2, 3], margins=[1.0, 0.001, 1.0]))
    assert not checks.judge_tokens(check, run(output("a", [1, 9, 3])), tie)[2]


def test_cached_tokens_judge_the_values_the_rule_allows() -> None:
    allowed = {"lo": 16, "hi": 32, "page": 16, "host": 0, "storage": 0, "text": "16..32 (multiple of 16)"}
    check = {"oracle": "cached_tokens", "passes": ["warm"], "cached": {"warm": {"a": allowed}}}
    assert checks.judge_cached_tokens(check, run(output("a", [1], cached_tokens=20)), run())[2]
    assert not checks.judge_cached_tokens(check, run(output("a", [1], cached_tokens=32)), run())[2]
    assert checks.judge_cached_tokens(check, run(output("a", [1], cached_tokens=32, cached_host=16)), run())[2]


def test_accept_length_drops_against_the_toggled_run() -> None:
    check = {"oracle": "accept_length", "passes": ["cold"], "accept": {"max": 4, "tolerance": 0.1}}
    good = run(output("a", [1] * 8, accepted=[3, 3], drafted=[3, 3]))
    bad = run(output("a", [1] * 8, accepted=[0, 0, 0], drafted=[3, 3, 3]))
    expected, got, present = checks.judge_accept_length(check, bad, good)
    assert present and got == "1" and "at least 3.6" in expected
    assert not checks.judge_accept_length(check, good, good)[2]


def pd_run(moved: int) -> dict:
    """A PD pass of two hybrid prompts (65 and 33 tokens, 32-token blocks, no hit) whose decode side read ``moved``."""
    ledger = {"bytes": moved, "hit": 0, "prompts": [65, 33], "block_size": 32, "block_bytes": 1000, "state_bytes": 7}
    one = {"outputs": [], "audit": [], "nan_events": 0, "pd": ledger}
    return {"raised": None, "passes": {"cold": one, "warm": one}}


def test_pd_audit_sees_a_byte_shortfall_and_passes_equal_bytes(capsys) -> None:
    """One token backed off: 65 → 2 blocks, 33 → 1, each request's state: 3 × 1000 + 2 × 7 bytes."""
    check = {"oracle": "pd_audit", "check": "bytes", "passes": ["cold"], "requested": {}, "backoff": 1}
    expected, got, present = checks.judge_pd_audit(check, pd_run(2014), pd_run(3014))
    assert present and got == "2014 B"
    assert expected == ("cold: NIXL moves 3014 B (3 block(s) past the decode side's hit × 1000 B + 2 request "
                        "state(s) × 7 B)")
    assert not checks.judge_pd_audit(check, pd_run(3014), pd_run(3014))[2]
    assert checks.judge_pd_audit({**check, "backoff": 0}, pd_run(3014), run())[2]  # 65 tokens whole: 3 blocks
    assert checks.reproduce(check, pd_run(2014), run(), "spec=draft") == 1
    assert "cold NIXL moved 2014 B into the decode side" in capsys.readouterr().out
    assert checks.reproduce(check, pd_run(3014), run(), "spec=draft") == 0


def test_reproduce_exits_one_while_the_failure_shows_zero_once_fixed(capsys) -> None:
    full = run(output("a", [1, 2]), output("b", [3, 4]))
    assert checks.reproduce(CHECK, run(output("a", [1, 2])), full, "scheduler=priority") == 1
    assert "BUG PRESENT" in capsys.readouterr().out
    assert checks.reproduce(CHECK, full, full, "scheduler=priority") == 0
    assert checks.reproduce(CHECK, run(raised="ValueError: x"), full, "scheduler=priority") == 2
    error = {"oracle": "error", "check": "IndexError", "passes": ["cold"], "requested": {}}
    assert checks.reproduce(error, run(raised="IndexError: 4"), full, "spec=mtp") == 1
    assert checks.reproduce(error, run(raised="KeyError: 4"), full, "spec=mtp") == 2
    assert checks.reproduce(error, full, full, "spec=mtp") == 0
    assert checks.reproduce(error, run(raised="IndexError: 4"), run(raised="TypeError: 1"), "spec=mtp") == 2


def test_the_toggled_run_is_noted_where_it_fails_a_check_that_holds_whatever_the_setting(capsys) -> None:
    """A request lost with the toggle too is worth a note; a toggled run's cached tokens are not judged by the failing
    setting's cache rule (the disk tier's 32 against prefix caching off: 0 is that setting's own rule)."""
    lost = run(output("a", [1, 2]))
    assert checks.reproduce(CHECK, lost, lost, "scheduler=priority") == 1
    assert "note: the toggled run fails this check too" in capsys.readouterr().out
    allowed = {"lo": 32, "hi": 32, "page": 32, "host": 0, "storage": None, "text": "32"}
    check = {"oracle": "cached_tokens", "passes": ["warm"], "cached": {"warm": {"a": allowed}}}
    missed = run(output("a", [1], cached_tokens=0))
    assert checks.reproduce(check, missed, missed, "cache=storage") == 1
    assert "note:" not in capsys.readouterr().out


def test_every_oracle_a_script_judges_has_a_check() -> None:
    assert set(checks.JUDGES) == {"completeness", "tokens", "logprobs", "cached_tokens", "nan", "pool_audit",
                                  "accept_length", "pd_audit", "inputs", "error"}


def test_inputs_sees_an_input_the_engine_changed_and_passes_without_one() -> None:
    changed = run(output("a", [1, 2]))
    changed["passes"]["warm"] = {**changed["passes"]["warm"], "inputs": [
        {"request": "a", "field": "prompt.prompt_token_ids[2:]", "before": "[]",
         "after": "[9]"}]}
    expected, got, present = checks.judge_inputs({"oracle": "inputs"}, changed, run())
    assert present and got == "warm a prompt.prompt_token_ids[2:]: [] -> [9]" and expected == "every input as it was handed"
    assert not checks.judge_inputs({"oracle": "inputs"}, run(output("a", [1, 2])), run())[2]


def test_inputs_with_a_field_named_judges_that_field_alone() -> None:
    """vLLM's offline API sets output_kind on every call (a finding of its own); a script for the prompt it shortens
    judges the prompt, so it exits 0 once that is fixed whatever output_kind does."""
    changed = run(output("a", [1, 2]))
    kind = {"request": "a", "field": "sampling_params.output_kind", "check": "sampling_params.output_kind",
            "before": "0", "after": "2"}
    prompt = {"request": "a", "field": "prompt.prompt_token_ids[2:]", "check": "prompt.prompt_token_ids[]",
              "before": "[9]", "after": "[]"}
    changed["passes"]["warm"] = {**changed["passes"]["warm"], "inputs": [kind, prompt]}
    asked = {"oracle": "inputs", "check": "prompt.prompt_token_ids[]"}
    expected, got, present = checks.judge_inputs(asked, changed, run())
    assert present and expected == "prompt.prompt_token_ids[] as it was handed"
    assert got == "warm a prompt.prompt_token_ids[2:]: [9] -> []"
    changed["passes"]["warm"]["inputs"] = [kind]
    assert not checks.judge_inputs(asked, changed, run())[2]



@pytest.mark.parametrize("module, engine", [(checks, set()), (reference_standalone, {"reference_impl"}),
                                            (weights, {"torch", "safetensors"}), (vllm_standalone, {"vllm"})])
def test_the_standalone_code_imports_nothing_of_kvmatrix(module, engine: set[str]) -> None:
    """What a script copies in imports the standard library and its engine alone."""
    tree = ast.parse(inspect.getsource(module))
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)  # a sibling's definitions are copied in beside
              if isinstance(node, ast.ImportFrom) and not node.level}
    assert names - engine <= set(sys.stdlib_module_names), names - engine - set(sys.stdlib_module_names)


def test_the_inline_dense_recipe_is_the_checkpoint_the_engines_serve(tmp_path) -> None:
    """A vLLM or llama.cpp script rebuilds the served dense model from its seed: the very tensors
    harness.models.checkpoints exports from the reference model, and a checkpoint directory an engine loads."""
    import torch
    from safetensors.torch import load_file

    from harness.models.checkpoints import SERVED_DENSE, dense_tensors, llama_config

    config = llama_config(SERVED_DENSE)
    inline, exported = weights.dense_tensors(config, SERVED_DENSE.seed), dense_tensors(SERVED_DENSE)
    assert inline.keys() == exported.keys()
    assert all(torch.equal(inline[name], exported[name]) for name in exported)
    written = load_file(f"{weights.write_checkpoint(tmp_path / 'dense', config, inline)}/model.safetensors")
    assert all(torch.equal(written[name], exported[name]) for name in exported)


@pytest.mark.parametrize("cpuinfo, judged", [(AMX_XEON, True), (AMD_EPYC, False)])
def test_a_finding_that_needs_amx_cannot_be_judged_on_a_cpu_without_it(tmp_path: Path, capsys, cpuinfo: str,
                                                                       judged: bool) -> None:
    """Recorded cpuinfo of both kinds: the AMX Xeon runs the settings, the EPYC exits 2, one line naming the flag."""
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    if judged:
        checks.require([], "", ["amx_int8", "amx_tile"], str(tmp_path / "cpuinfo"))
    else:
        with pytest.raises(SystemExit) as exited:
            checks.require([], "", ["amx_int8", "amx_tile"], str(tmp_path / "cpuinfo"))
        assert exited.value.code == checks.CANNOT_JUDGE
    said = capsys.readouterr().err
    assert (said.startswith(checks.CANNOT_JUDGE_LINE) and "lacks amx_int8 amx_tile" in said) == (not judged), said


def test_a_missing_package_cannot_be_judged_and_names_the_install_line(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        checks.require(["json", "no_such_module_here"], "pip install it", [])
    said = capsys.readouterr().err
    assert exited.value.code == checks.CANNOT_JUDGE
    assert "no_such_module_here not installed" in said and "json" not in said.split("not installed")[0]
    assert said.rstrip().endswith("install: pip install it") and said.count("\n") == 1


def test_an_exception_of_the_scripts_own_cannot_be_judged(capsys) -> None:
    """Not 1 ("bug present"): whatever the script itself raised says nothing of the bug."""
    def broken() -> int:
        raise KeyError("prefill")
    with pytest.raises(SystemExit) as exited:
        checks.judged(broken)
    said = capsys.readouterr().err
    assert exited.value.code == checks.CANNOT_JUDGE and "Traceback" in said
    assert f"{checks.CANNOT_JUDGE_LINE} the script itself raised KeyError" in said
    assert checks.judged(lambda: 1) == 1 and checks.judged(lambda: 0) == 0


def test_a_script_on_a_host_without_its_flag_exits_2_before_running_anything(tmp_path: Path) -> None:
    """The gate a script is assembled with, run as a script: a flag this machine lacks stops it with 2 and one line
    before anything beside the standard library is imported; one it has (or none asked) lets ``main`` run."""
    lacking = next(flag for flag in KERNEL_FLAGS if flag not in cpu_flags())  # sve on x86, avx512f on Arm
    main = "def main():\n    print('RAN')\n    return 1"
    for needs, status in (([lacking], checks.CANNOT_JUDGE), (sorted(cpu_flags() & set(KERNEL_FLAGS))[:1], 1),
                          ([], 1)):
        script = tmp_path / "repro.py"
        script.write_text(assemble('"""doc"""', set(), [], [], main, [], ["pip install nothing"], needs))
        done = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=60)
        assert done.returncode == status, (needs, done.stdout, done.stderr)
        assert ("RAN" in done.stdout) == (status == 1)
        assert (f"lacks {lacking}" in done.stderr) == (status == checks.CANNOT_JUDGE), done.stderr


def test_a_pair_whose_prefill_side_let_leases_expire_says_so_and_one_without_says_nothing() -> None:
    """The prefill side's expired leases (``vllm:nixl_num_kv_expired_reqs``) are the cause a maintainer reads first:
    the pass says how many, and a pass without any says nothing of leases."""
    expired = pd_run(3014)
    expired["passes"]["cold"] = {**expired["passes"]["cold"], "pd": {
        **expired["passes"]["cold"]["pd"], "nixl_expired_leases": 2, "nixl_reads_after_expiry": 1}}
    text = checks.describe("with pd=nixl", expired)
    assert "cold the prefill side freed 2 request(s)' blocks unread when their lease ran out, and heard of 1 read(s)" \
        in text
    assert "lease" not in checks.describe("with pd=nixl", pd_run(3014))
