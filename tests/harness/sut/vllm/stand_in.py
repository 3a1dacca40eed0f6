"""A stand-in for vLLM's child: a script run by a fake interpreter the vllm engine is pointed at."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest


def point_vllm_at(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``source`` the child every vllm engine of the test starts; returns the file each child writes its pid to."""
    script = tmp_path / "stand_in_child.py"
    script.write_text(source)
    python = tmp_path / "fake-python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    python.chmod(0o755)
    pids = tmp_path / "pids"
    pids.touch()
    monkeypatch.setenv("KVMATRIX_VLLM_PYTHON", str(python))
    monkeypatch.setenv("FAKE_CHILD_PIDS", str(pids))
    return pids
