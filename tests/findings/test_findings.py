"""The engine findings under ``findings/``, strict like xfail: each script still shows its bug (exit 1) on the engine
version the project pins, and says so when an upgrade fixed it; a script against a stand-in engine without the bug
exits 0, as it will once the engine is fixed."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness.repro.standalone.checks import CANNOT_SHOW
from harness.sut.openai.launch import llama_server_path
from harness.sut.vllm import vllm_python
from tests.binaries import required_path

ROOT = Path(__file__).resolve().parents[2]
#: each vLLM finding's script (a finding without one says in its REPORT.md why none fails)
VLLM_SCRIPTS = sorted(ROOT.glob("findings/vllm-*/repro.py"))
#: each llama.cpp finding's script (run with this project's interpreter: it has torch and gguf)
LLAMACPP_SCRIPTS = sorted(ROOT.glob("findings/llamacpp-*/repro.py"))
#: a finding's script runs in well under this (BENCHMARKS.md, "vLLM reproducers", "llama.cpp reproducers")
TIMEOUT_S = 300
STAND_IN = Path(__file__).with_name("stand_in")


def skip_where_it_cannot_show(done: subprocess.CompletedProcess) -> None:
    """A finding that shows only on a CPU with some flags (its script's ``NEEDS_CPU``) is skipped on a host without
    them, by the one line its script prints there before running anything."""
    if done.returncode == CANNOT_SHOW and "CANNOT SHOW HERE" in done.stdout:
        pytest.skip(done.stdout.strip().splitlines()[-1])


def still_shows(done: subprocess.CompletedProcess, script: Path, engine: str, matrix: str) -> None:
    """A script run on the pinned engine exits 1 with its bug; exit 0 says the engine fixed it."""
    skip_where_it_cannot_show(done)
    tail = (done.stdout + done.stderr)[-3000:]
    if done.returncode == 0:
        pytest.fail(f"{script.parent.name} is fixed by this {engine} version: remove or update findings/"
                    f"{script.parent.name} and its [[expected]] entry in {matrix}\n{tail}")
    assert done.returncode == 1, f"{script.parent.name}: exit {done.returncode}, not the bug\n{tail}"
    assert "BUG PRESENT" in done.stdout


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM engine at a time
@pytest.mark.parametrize("script", VLLM_SCRIPTS, ids=lambda path: path.parent.name)
def test_the_vllm_finding_still_shows(script: Path) -> None:
    python = required_path(vllm_python(), "vllm-env")
    done = subprocess.run([str(python), "-I", script.name], cwd=script.parent, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    still_shows(done, script, "vLLM", "matrices/vllm.toml")


@pytest.mark.llamacpp
@pytest.mark.xdist_group("llamacpp")  # make test's --dist loadgroup: one llama-server at a time
@pytest.mark.parametrize("script", LLAMACPP_SCRIPTS, ids=lambda path: path.parent.name)
def test_the_llamacpp_finding_still_shows(script: Path) -> None:
    binary = required_path(llama_server_path(), "llama-server")
    done = subprocess.run([sys.executable, "-I", script.name], cwd=script.parent, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "LLAMA_SERVER": str(binary)})
    still_shows(done, script, "llama.cpp", "matrices/llamacpp.toml")


@pytest.mark.parametrize("script", VLLM_SCRIPTS, ids=lambda path: path.parent.name)
def test_a_vllm_script_exits_zero_on_an_engine_without_the_bug(script: Path, tmp_path: Path) -> None:
    """The stand-in (``stand_in/vllm``) serves both settings alike; the script runs without kvmatrix on its path."""
    path = f"{STAND_IN}:{sysconfig.get_paths()['purelib']}"
    done = subprocess.run([sys.executable, "-S", str(script)], cwd=tmp_path, env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    skip_where_it_cannot_show(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout


@pytest.mark.parametrize("script", LLAMACPP_SCRIPTS, ids=lambda path: path.parent.name)
def test_a_llamacpp_script_exits_zero_on_a_server_without_the_bug(script: Path, tmp_path: Path) -> None:
    """The stand-in (``stand_in/bin/llama-server``, found on PATH) answers both launches alike."""
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": f"{STAND_IN / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-S", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    skip_where_it_cannot_show(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout


def test_a_script_that_cannot_show_its_finding_here_is_skipped_with_its_line() -> None:
    """On a host whose CPU lacks a flag the finding needs, the script's exit CANNOT_SHOW and its line skip the test
    (whichever host runs this); any other exit is judged."""
    line = ("CANNOT SHOW HERE: this finding needs a CPU with amx_tile; this CPU lacks amx_tile (/proc/cpuinfo), so "
            "neither setting was run")
    cannot = subprocess.CompletedProcess([], CANNOT_SHOW, stdout=f"{line}\n", stderr="")
    with pytest.raises(pytest.skip.Exception, match="CANNOT SHOW HERE"):
        skip_where_it_cannot_show(cannot)
    for shows in (subprocess.CompletedProcess([], 1, stdout="BUG PRESENT\n", stderr=""),
                  subprocess.CompletedProcess([], CANNOT_SHOW, stdout="", stderr="Traceback ...")):
        skip_where_it_cannot_show(shows)  # judged, not skipped
