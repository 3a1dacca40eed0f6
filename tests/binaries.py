"""What some tests need from outside the project: Debian's programs, and what make builds (vLLM's venv,
llama-server). Skip without them, except under CI=true, where .ci/run provides them and a missing one fails. And
how a test runs a program that starts engines of its own (``run_group``)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest


def required_binary(name: str, what: str) -> str:
    """The path of program ``name``; skip without it, except under CI=true, where a missing one fails."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed, and CI=true requires {what} to run")
        pytest.skip(f"{name} is not installed (apt-get install {name}); CI=true makes this a failure")
    return binary


def required_path(path: Path, make_target: str) -> Path:
    """``path``, which ``make MAKE_TARGET`` builds; skip without it, except under CI=true, where a missing one fails."""
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {path} is missing: .ci/run builds it with make {make_target}")
        pytest.skip(f"no {path} (make {make_target}); CI=true makes this a failure")
    return path


def run_group(args: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` in a session of its own: past ``timeout`` the whole
    group is killed, the engine processes a finding's script starts included (``subprocess.run`` kills only the
    script, and its engines went on spinning on every core for the rest of the suite), then TimeoutExpired."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
