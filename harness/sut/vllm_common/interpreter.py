"""Where vLLM's environment is: the interpreter both of its paths run (the offline engine's child, an api_server a
launch names by ``{vllm_python}``) and ``harness repro`` checks a vLLM script with."""
from __future__ import annotations

import os
from pathlib import Path

PYTHON_ENV = "KVMATRIX_VLLM_PYTHON"
DEFAULT_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path:
    """The interpreter of vLLM's environment: ``$KVMATRIX_VLLM_PYTHON``, else ``.venv-vllm``."""
    return Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON)
