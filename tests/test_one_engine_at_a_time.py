"""make test runs the real engines one at a time: their tests share ``xdist_group("vllm")`` and ``--dist loadgroup``
sends a group to one worker. A vLLM child's or llama-server's OpenMP threads spin on every core, so two engines on
2 cores starve each other and cells run many times slower or time out. With pytest 9.2 and xdist 3.8 the groups are
silently dropped (pytest-dev/pytest-xdist#1386), which the pin in pyproject.toml avoids and this test would see."""
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
