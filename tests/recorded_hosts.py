"""Two hosts as runs recorded them (tests/data/hosts): an Intel Xeon with AMX and an AMD EPYC with AVX-512 and no
AMX, each with llama-server's build as it reported itself there; and runs of one matrix on them, as report
directories (results.jsonl and runs.jsonl), for compare, report and JUnit tests on any host."""
from __future__ import annotations

import json
from pathlib import Path

from harness.results.header import RunHeader
from harness.sut.host import Host, cpu_model_of, flags_of, kernel_flags_of
from harness.sut.openai.llamacpp_build import features, version_facts

DATA = Path(__file__).resolve().parent / "data" / "hosts"
HOSTS = ("xeon_amx", "epyc")
#: the smollm2 llama.cpp cell whose Q4_1 matmuls take ggml's AMX kernels where llama.cpp enabled them
AMX_CELL = "/model:smollm2/cache:device/spec:none/"
CELLS = (AMX_CELL, "/model:smollm2/cache:off/spec:none/", "/model:smollm2/cache:device/spec:draft/")


def host(name: str) -> Host:
    """The host record a run on recorded host ``name`` writes: its CPU from its cpuinfo, 2 cores, no GPU, and
    llama-server's build from its ``--version`` and system_info output there."""
    cpuinfo = (DATA / f"cpuinfo_{name}.txt").read_text()
    llama = (DATA / f"llamacpp_{name}.txt").read_text()
    return Host(cpu_model_of(cpuinfo), kernel_flags_of(flags_of(cpuinfo)), 2, None,
                {"llamacpp": {**version_facts(llama), **features(llama)}})


def header(run_id: str, name: str, *, machine: bool = True) -> dict:
    """A run header of the smollm2 llama.cpp matrix on recorded host ``name`` (``machine`` False: as a kvmatrix
    before host records wrote it, with ``cpu_flags`` alone)."""
    record = host(name)
    made = RunHeader(
        run_id=run_id, matrix="smollm2_llamacpp", matrix_arg="smollm2_llamacpp", matrix_file="matrices/x.toml",
        matrix_sha256="0" * 64, mode="full", strength=None, faults=[], device="cpu", device_name="CPU (x86_64)",
        shard=None, cells_planned=len(CELLS), commit="abc", date="2026-12-05T00:00:00+00:00", host=f"runner-{name}",
        versions={"python": "3.11.2", "torch": "2.13.0+cpu", "triton": "absent"}, engine="openai",
        cpu_flags=record.cpu_flags, machine=record.to_json() if machine else {}).to_json()
    if not machine:
        del made["machine"]
    return made


def row(cell: str, status: str, run_id: str, failing: tuple[str, ...] = ()) -> dict:
    """A results row of ``cell``: ``status``, the oracles in ``failing`` failed and the rest passed."""
    oracles = {name: {"verdict": "fail" if name in failing else "pass", "message": "", "detail": []}
               for name in ("tokens", "logprobs", "cached_tokens")}
    return {"cell_id": cell, "matrix": "smollm2_llamacpp", "factors": dict(part.split(":") for part in
                                                                           cell.strip("/").split("/")),
            "status": status, "oracles": oracles, "faults": [], "error": None, "run_id": run_id, "device": "cpu",
            "metrics": {"wall_seconds": 10.0}}


def write_run(directory: Path, headers: list[dict], rows: list[dict]) -> Path:
    """A report directory holding ``rows`` and ``headers``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "runs.jsonl").write_text("".join(json.dumps(h) + "\n" for h in headers))
    return directory


def nightly(directory: Path, name: str, run_id: str, amx_fails: bool, *, machine: bool = True) -> Path:
    """One night's run of the three cells on host ``name``: the AMX cell xfail (tokens) where ``amx_fails``, else
    pass; the draft cell failing tokens either way (a failure no host explains)."""
    rows = [row(AMX_CELL, "xfail", run_id, ("tokens",)) if amx_fails else row(AMX_CELL, "pass", run_id),
            row(CELLS[1], "pass", run_id), row(CELLS[2], "fail", run_id, ("tokens",))]
    return write_run(directory, [header(run_id, name, machine=machine)], rows)
