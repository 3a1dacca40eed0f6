"""The run header: what a person needs to trust and repeat a run (matrix file hash, device, commit, versions).

The options that define a run are declared here once (``RUN_OPTIONS``): ``harness run`` and
``pytest -m matrix`` add them from this table, and every reproduce line is built back from it.
"""
from __future__ import annotations

import hashlib
from importlib import metadata
import platform
import shlex
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from harness.results.files import DEFAULT_REPORT_DIR


@dataclass(frozen=True, slots=True)
class RunOption:
    """A command-line option that defines a run, as ``harness run`` spells it (``pytest_flag`` where pytest differs)."""

    flag: str
    help: str
    kwargs: Mapping[str, object] = field(default_factory=dict)  # argparse/pytest ``add_argument`` keywords
    pytest_flag: str | None = None

    @property
    def dest(self) -> str:
        """The name its value goes by in ``values`` (``--inject-fault`` → ``inject_fault``)."""
        return self.flag.lstrip("-").replace("-", "_")

    def spelled(self, pytest: bool) -> str:
        return self.pytest_flag if pytest and self.pytest_flag else self.flag


#: in the order reproduce lines give them.
RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("--matrix", "matrix name (matrices/NAME.toml) or path to a .toml file", {"metavar": "NAME"}),
    RunOption("--strength", "generate a t-wise covering array of this strength", {"type": int, "metavar": "T"}),
    RunOption("--shard", "run only shard I of N of the cells (1-based)", {"metavar": "I/N"}, pytest_flag="--matrix-shard"),
    RunOption("--device", "torch device of every pool and model (cuda: compiled Triton)", {"default": "cpu"}),
    RunOption("--report-dir", "where results.jsonl, summary.json, index.html go",
              {"default": str(DEFAULT_REPORT_DIR), "metavar": "DIR"}),
    RunOption("--inject-fault", "turn on a named fault (repeatable)", {"action": "append", "default": [], "metavar": "NAME"}),
)
OPTIONS_BY_DEST: Mapping[str, RunOption] = {option.dest: option for option in RUN_OPTIONS}


def add_run_options(add: Callable[..., object], dests: Sequence[str], *, pytest: bool = False) -> None:
    """Declare the options named by ``dests`` through ``add`` (argparse's ``add_argument``, pytest's ``addoption``)."""
    for dest in dests:
        option = OPTIONS_BY_DEST[dest]
        add(option.spelled(pytest), dest=dest, help=option.help, **option.kwargs)


def option_arguments(values: Mapping[str, object], *, pytest: bool = False) -> list[str]:
    """The flags that give ``values`` (dest → value; None, False and [] left out) back, in ``RUN_OPTIONS`` order."""
    args: list[str] = []
    for option in RUN_OPTIONS:
        value = values.get(option.dest)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and item is not False:
                args += [option.spelled(pytest), str(item)]
    return args


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
    engine: str = ""
    engine_version: str | None = None  # what the engine says it is (``Engine.version``); None when it cannot say
    #: the CPU flags an engine's kernels choose their path by that this machine has (``harness.sut.host``)
    cpu_flags: list[str] = field(default_factory=list)
    #: the host record (``harness.sut.host.Host.to_json``): CPU model, flags and cores, the GPU, the engine's version
    #: and build; compare and a merged report name the facts two runs' hosts differ in
    machine: dict = field(default_factory=dict)
    #: a ``--resume --accept-changed`` run: each ``RESUME_FIELDS`` field that changed, as "recorded → now"
    accepted_changes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


#: what ``--resume`` compares with the run it resumes: when one differs, the rows it would keep judged another run.
RESUME_FIELDS = ("matrix_sha256", "faults", "strength", "device", "engine_version", "cpu_flags")


def changed_since(recorded: Mapping[str, object], header: RunHeader) -> dict[str, str]:
    """Each ``RESUME_FIELDS`` field where ``header`` differs from the ``recorded`` header, as "recorded → now";
    a field the recorded header lacks (written by an older kvmatrix) is not compared."""
    now = header.to_json()
    return {name: f"{_shown(recorded[name])} → {_shown(now[name])}" for name in RESUME_FIELDS
            if name in recorded and recorded[name] != now[name]}


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return "none" if value is None else str(value)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes: two runs with the same hash ran the same matrix definition."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def new_run_id() -> str:
    """A run's id: 12 hex digits, random (two runs never share one)."""
    return uuid.uuid4().hex[:12]


def now() -> str:
    """The date a header carries: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed: ``python -m harness run ...`` (or pytest's own argv), shell-quoted."""
    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else ""
    if program.endswith(("harness/__main__.py", "harness\\__main__.py")):
        return shlex.join(["python", "-m", "harness", *argv[1:]])
    return shlex.join([Path(program).name or "python", *argv[1:]])


def reproduce_command(header: Mapping[str, object], cell_id: str, report_dir: str = "reports/repro") -> str:
    """The ``harness run`` line that reruns one cell of a run exactly: same matrix, strength, faults, device."""
    values = {"matrix": header.get("matrix_arg") or header.get("matrix"), "device": header.get("device") or "cpu",
              "strength": header.get("strength") if header.get("mode") == "t-wise" else None,
              "inject_fault": header.get("faults") or []}
    return shlex.join(["python", "-m", "harness", "run", *option_arguments(values), "--cell", cell_id,
                       "--report-dir", report_dir])


#: the statuses ``harness repro`` writes a reproducer for (its ``REPRODUCIBLE``): a cell that failed, raised or failed
#: as declared.
REPRO_STATUSES = ("fail", "error", "xfail")


def repro_command(report_dir: str, cell_id: str) -> str:
    """The ``harness repro`` line that shrinks one cell of the run in ``report_dir`` into a standalone script."""
    return shlex.join(["python", "-m", "harness", "repro", report_dir, "--cell", cell_id])
