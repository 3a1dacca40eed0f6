"""The nightly GPU workflow's own command lines, run here on CPU shards: shard, merge, compare, red on new failures only."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly-gpu.yml"

#: one passing cell and one that raises: shard 2's error is the night's failure.
MATRIX = """
[matrix]
name = "nightly_cpu"
mode = "full"
workloads = ["pair"]

[factors]
model = ["dense"]
scheduler = ["fcfs", "tests.components:ExplodingQueue"]
page_size = [16]
"""


def workflow_line(command: str) -> str:
    """The workflow's ``run:`` line that calls ``scripts/nightly COMMAND``."""
    (line,) = [m.group(1) for m in re.finditer(r"^\s+run: (scripts/nightly \S+ .*)$", WORKFLOW.read_text(), re.M)
               if m.group(1).split()[1] == command]
    return line


def run_step(line: str, cwd: Path, env: dict[str, str], shard: str = "") -> subprocess.CompletedProcess:
    """Run a workflow line as GitHub would, with ``${{ matrix.shard }}`` filled in."""
    command = line.replace("${{ matrix.shard }}", shard)
    assert "${{" not in command, command
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_workflow_steps_shard_merge_and_fail_on_new_failures_only(tmp_path: Path) -> None:
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    matrix = tmp_path / "nightly_cpu.toml"
    matrix.write_text(MATRIX)
    env = {**os.environ, "MATRIX": str(matrix), "DEVICE": "cpu", "SHARDS": "2", "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT)}
    for shard in ("1", "2"):
        done = run_step(workflow_line("shard"), tmp_path, env, shard)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "shards" / shard / "junit.xml").exists()

    first_night = run_step(workflow_line("merge"), tmp_path, env)
    assert first_night.returncode == 1, first_night.stdout + first_night.stderr
    assert "new failures: 1" in first_night.stdout and "ExplodingQueue" in first_night.stdout
    merged = tmp_path / "merged"
    assert len((merged / "results.jsonl").read_text().splitlines()) == 2
    for name in ("index.html", "report.css", "junit.xml", "compare.html", "compare.txt", "runs.jsonl"):
        assert (merged / name).exists(), name

    shutil.move(merged, tmp_path / "previous")  # what the workflow downloads as the previous night's results
    next_night = run_step(workflow_line("merge"), tmp_path, env)
    assert next_night.returncode == 0, next_night.stdout + next_night.stderr
    assert "new failures: 0" in next_night.stdout and "still failing: 1" in next_night.stdout
