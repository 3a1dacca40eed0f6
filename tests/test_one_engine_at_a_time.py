"""make test runs each group of real-engine tests on one worker: ``--dist loadgroup`` sends an ``xdist_group`` to one
worker. The vLLM engine tests (``"vllm"``) share their golden runs there; the llama.cpp tests (``"llamacpp"``) run one
llama-server at a time, whose threads would otherwise wait at every op's barrier for a core the other holds. With
pytest 9.2 and xdist 3.8 the groups are silently dropped (pytest-dev/pytest-xdist#1386), which the pin in
pyproject.toml avoids and this test would see."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os
import pytest

@pytest.mark.xdist_group("vllm")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.path.join(os.environ["RAN"], f"ran-{i}"), "w") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
               "--rootdir", str(tmp_path), "test_grouped.py"]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "RAN": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.read_text() for path in tmp_path.glob("ran-*")}
    assert len(list(tmp_path.glob("ran-*"))) == 6 and len(workers) == 1, workers
