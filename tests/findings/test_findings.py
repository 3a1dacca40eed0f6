"""The engine findings under ``findings/``, strict like xfail: each script still shows its bug (exit 1) on the engine
version the project pins, and says so when an upgrade fixed it; a script against a stand-in engine without the bug
exits 0, as it will once the engine is fixed."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness.sut.vllm import vllm_python
from tests.binaries import required_path

ROOT = Path(__file__).resolve().parents[2]
#: each vLLM finding's script (a finding without one says in its REPORT.md why none fails)
VLLM_SCRIPTS = sorted(ROOT.glob("findings/vllm-*/repro.py"))
#: a vLLM finding's script runs in well under this (BENCHMARKS.md, "vLLM reproducers")
TIMEOUT_S = 300
STAND_IN = Path(__file__).with_name("stand_in")


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM engine at a time
@pytest.mark.parametrize("script", VLLM_SCRIPTS, ids=lambda path: path.parent.name)
def test_the_vllm_finding_still_shows(script: Path) -> None:
    python = required_path(vllm_python(), "vllm-env")
    done = subprocess.run([str(python), "-I", script.name], cwd=script.parent, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    tail = (done.stdout + done.stderr)[-3000:]
    if done.returncode == 0:
        pytest.fail(f"{script.parent.name} is fixed by this vLLM version: remove or update findings/"
                    f"{script.parent.name} and its [[expected]] entry in matrices/vllm.toml\n{tail}")
    assert done.returncode == 1, f"{script.parent.name}: exit {done.returncode}, not the bug\n{tail}"
    assert "BUG PRESENT" in done.stdout


@pytest.mark.parametrize("script", VLLM_SCRIPTS, ids=lambda path: path.parent.name)
def test_a_vllm_script_exits_zero_on_an_engine_without_the_bug(script: Path, tmp_path: Path) -> None:
    """The stand-in (``stand_in/vllm``) serves both settings alike; the script runs without kvmatrix on its path."""
    path = f"{STAND_IN}:{sysconfig.get_paths()['purelib']}"
    done = subprocess.run([sys.executable, "-S", str(script)], cwd=tmp_path, env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIXED" in done.stdout
