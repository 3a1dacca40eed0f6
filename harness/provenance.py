"""The run header: what a person needs to trust and repeat a run (matrix file hash, device, commit, versions)."""
from __future__ import annotations

import hashlib
from importlib import metadata
import platform
import shlex
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from harness.matrix import MatrixSpec


@dataclass(slots=True)
class RunHeader:
    """One invocation of ``harness run`` (or one pytest session): one line of runs.jsonl."""

    run_id: str
    matrix: str
    matrix_arg: str  # what was passed to --matrix: a name under matrices/ or a path
    matrix_file: str
    matrix_sha256: str
    mode: str
    strength: int | None
    faults: list[str]
    device: str
    device_name: str
    shard: str | None
    cells_planned: int
    commit: str
    date: str
    host: str
    versions: dict[str, str] = field(default_factory=dict)
    command: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes: two runs with the same hash ran the same matrix definition."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_commit(cwd: Path) -> str:
    """``HEAD``'s commit, with ``+dirty`` when tracked files differ from it; ``unknown`` outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU as the platform names it."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.machine()}{', ' + platform.processor() if platform.processor() else ''})"


def versions() -> dict[str, str]:
    """Python, torch and triton versions, from package metadata: importing triton here would fix its
    interpreter mode before ``reference_impl`` decides it (TRITON_INTERPRET is read at import)."""
    found = {"python": platform.python_version()}
    for package in ("torch", "triton"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "absent"
    return found


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed: ``python -m harness run ...`` (or pytest's own argv), shell-quoted."""
    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else ""
    if program.endswith(("harness/__main__.py", "harness\\__main__.py")):
        return shlex.join(["python", "-m", "harness", *argv[1:]])
    return shlex.join([Path(program).name or "python", *argv[1:]])


def run_header(spec: MatrixSpec, matrix_arg: str, faults: Sequence[str], device: str, shard: str | None,
               cells_planned: int, argv: Sequence[str] | None = None) -> RunHeader:
    """The header of a run about to start on ``device`` (``shard`` as ``I/N`` or None)."""
    return RunHeader(
        run_id=uuid.uuid4().hex[:12], matrix=spec.name, matrix_arg=matrix_arg, matrix_file=str(spec.path),
        matrix_sha256=file_sha256(spec.path), mode=spec.mode, strength=spec.strength, faults=sorted(faults),
        device=device, device_name=device_name(device), shard=shard, cells_planned=cells_planned,
        commit=git_commit(Path(__file__).resolve().parents[1]),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"), host=socket.gethostname(),
        versions=versions(), command=command_line(argv),
    )


def reproduce_command(header: Mapping[str, object], cell_id: str, report_dir: str = "reports/repro") -> str:
    """The ``harness run`` line that reruns one cell of a run exactly: same matrix, strength, faults, device."""
    args = ["python", "-m", "harness", "run", "--matrix", str(header.get("matrix_arg") or header.get("matrix"))]
    if header.get("mode") == "t-wise" and header.get("strength"):
        args += ["--strength", str(header["strength"])]
    for fault in header.get("faults") or []:
        args += ["--inject-fault", str(fault)]
    args += ["--device", str(header.get("device") or "cpu")]
    return shlex.join([*args, "--cell", cell_id, "--report-dir", report_dir])
