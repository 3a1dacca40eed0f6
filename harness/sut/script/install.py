"""What a finding's install lines are written from, read from the Makefile that builds this project's own engine
environments (``make vllm-env``, ``make llama-server``): one source for the pins, so a REPORT's install line is the
environment the finding was verified in, and a pin bumped there changes every REPORT that renders it. Each engine's
writer writes its own lines from these (``vllm_lines`` in ``harness.sut.vllm.script``, for one)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: the Makefile the engines' pins are read from, and the project's own (gguf's).
MAKEFILE, PYPROJECT = ROOT / "Makefile", ROOT / "pyproject.toml"
#: where a maintainer's fresh environment goes, beside the script.
VENV = "venv"
#: the folder the llama.cpp build lines build in, beside the script.
BUILD = "llama.cpp"


def variables(makefile: Path = MAKEFILE) -> dict[str, str]:
    """The Makefile's ``NAME := value`` assignments, ``$(OTHER)`` expanded."""
    found: dict[str, str] = {}
    for line in makefile.read_text().splitlines():
        match = re.match(r"^([A-Z0-9_]+)\s*:?=\s*(.*)$", line)
        if match:
            found[match[1]] = re.sub(r"\$\((\w+)\)", lambda m: found.get(m[1], m[0]), match[2].strip())
    return found


def cmake_flags(makefile: Path = MAKEFILE) -> str:
    """The ``-D`` flags the Makefile configures llama.cpp's build with (its ``cmake -S`` line and continuations)."""
    text = makefile.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "cmake -S" in line)
    return " ".join(word for word in line.split() if word.startswith("-D"))


def torch_pin(makefile: Path = MAKEFILE) -> str:
    """The torch the Makefile installs into the harness's venv (``torch==…``)."""
    return re.search(r"pip install --quiet (torch==\S+)", makefile.read_text())[1]


def project_pin(name: str) -> str:
    """The project's own requirement on ``name`` (``gguf==0.19.0``), from pyproject.toml."""
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(r for r in requirements if re.match(rf"{re.escape(name)}\b", r))
