"""llama-server's build, as a run's header records it (``Engine.build``): what ``--version`` prints (build number,
commit, compiler, target) and the features each ggml backend was compiled with and enabled on this host, from its
``system_info`` line (``CPU : SSE3 = 1 | … | AVX512 = 1 | … | AMX_INT8 = 1 | … | REPACK = 1 |``). Those features
choose its kernels: with ``AMX_INT8 = 1`` ggml's AMX backend takes quantized matmuls (Q4_0, Q4_1, Q8_0 …), so
SmolLM2's Q4_1 GGUF runs AMX tiles on one host and AVX-512 on another.

The vendored llama.cpp (0c1e570) prints ``system_info`` only at trace verbosity (``-lv 4``), after reading its
arguments and before loading a model; a cell's server log never has it. ``probe`` starts the binary once at trace
verbosity with a model path that does not exist: it prints the line, fails to load and exits, having loaded no
weights and served nothing (BENCHMARKS.md has what that costs).
"""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from harness.sut.openai.launch import HOST, PROGRAMS, artefact, free_port
from harness.sut.openai.table import placeholders
from harness.sut.openai.wire import ServerError

_VERSION = re.compile(r"^version:\s*(\S+)\s*\((?:build (\d+), commit )?(\w+)\)", re.M)
_BUILT = re.compile(r"^built with (.+) for (.+?)\s*$", re.M)
_SYSTEM_INFO = re.compile(r"system_info: [^|\n]*\|([^\n]*)")
#: the model path the probe names: nothing there, so the server exits before it loads anything.
NO_MODEL = "/nonexistent/kvmatrix-probe.gguf"


def version_facts(text: str) -> dict[str, str]:
    """``version``, ``build`` (its number), ``commit``, ``compiler`` and ``target`` from ``llama-server --version``'s
    output (``version: 0.0.1 (build 1, commit 0c1e570)``, older builds ``version: 1 (0c1e570)``; then ``built with
    GNU 12.2.0 for Linux x86_64``); those it does not print left out."""
    facts = {}
    if found := _VERSION.search(text):
        facts.update(version=found.group(1), **({"build": found.group(2)} if found.group(2) else {}),
                     commit=found.group(3))
    if found := _BUILT.search(text):
        facts.update(compiler=found.group(1).strip(), target=found.group(2))
    return facts


def features(text: str) -> dict[str, str]:
    """The backend features of the first ``system_info`` line in ``text``: the CPU's by their own names
    (``AMX_INT8``: ``1``), another backend's as ``BACKEND NAME`` (``CUDA ARCHS``); a feature ggml did not compile is
    absent, as ggml prints none for it."""
    found = _SYSTEM_INFO.search(text)
    if not found:
        return {}
    out, backend = {}, "CPU"
    for part in found.group(1).split("|"):
        head, colon, rest = part.partition(" : ")
        if colon:
            backend, part = head.strip(), rest
        name, eq, value = part.partition("=")
        if eq and name.strip():
            out[name.strip() if backend == "CPU" else f"{backend} {name.strip()}"] = value.strip()
    return out


def program_path(server: Mapping) -> Path | None:
    """The program a ``[server]`` table launches, where it names one this host has (``{llama_server}``, a path or a
    name on PATH); None where its levels name it per cell, or it is not here."""
    program = str(server["command"][0])
    names = set(placeholders(program))
    if names - set(PROGRAMS):
        return None
    try:
        found = shutil.which(program.format(**{name: artefact(name, {}) for name in names}))
    except ServerError:
        return None
    return Path(found) if found else None


@functools.cache
def probe(path: Path, mtime_ns: int) -> dict[str, str]:
    """The build facts of the llama-server at ``path`` (as it was at ``mtime_ns``): ``version_facts`` of its
    ``--version`` and the ``features`` of the system_info a trace-verbosity start with no model prints."""
    def output(*args: str) -> str:
        try:
            done = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout + done.stderr

    facts = version_facts(output("--version"))
    facts.update(features(output("-lv", "4", "-m", NO_MODEL, "--host", HOST, "--port", str(free_port()))))
    return facts


def build(server: Mapping) -> dict[str, str]:
    """llama-server's build facts for a ``[server]`` table that launches it (``probe``, once per binary); none where
    the program is not here."""
    path = program_path(server)
    return {} if path is None else probe(path.resolve(), path.stat().st_mtime_ns)
