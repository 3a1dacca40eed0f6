"""The real servers under engine = "openai": vLLM's api_server (``make vllm-env``) and llama.cpp's llama-server
(``make llama-server``). Their smoke matrices run to verdicts (pass or a declared xfail) with no server process
left afterwards, and each server's golden agrees token for token with the reference engine's on the exported dense
model (fp32, flash attention off: the ``cross_engine`` oracle, no request passed as a tie). Each skips without its
server, except under CI=true, where that fails.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.sut import process, vllm
from harness.sut.host import cpu_flags
from harness.sut.openai import launch
from harness.results.rows import error_type
from tests.binaries import required_path

#: what each server's processes have on their command line.
SERVER_COMMANDS = ("vllm.entrypoints.openai.api_server", "llama-server")


def needs_vllm() -> None:
    required_path(vllm.vllm_python(), "vllm-env")


def needs_llama_server() -> None:
    required_path(launch.llama_server_path(), "llama-server")


def running_servers(report: Path) -> list[str]:
    """Command lines of the live (not zombie) server processes a run into ``report`` started: their environment
    holds the run's log directory (``harness run`` sets it), which tells them from any other run's."""
    marker = f"{process.LOGS_ENV}={report.resolve()}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if marker in environ and any(name in cmdline for name in SERVER_COMMANDS) and process.is_live(int(proc.name)):
            found.append(cmdline)
    return found


def run_smoke(tmp_path: Path, matrix: str) -> dict[str, str]:
    """cell → status of a run of ``matrix``, every cell passing or failing only as declared, no server left."""
    return {cell: row["status"] for cell, row in smoke_rows(tmp_path, matrix).items()}


def agrees_with_the_reference(rows: dict[str, dict]) -> None:
    """The server's golden and the reference engine's on the exported dense model agree token for token (fp32, flash
    attention off): ``cross_engine`` compared every golden request and let none pass as a tie."""
    for row in rows.values():
        verdict = row["oracles"]["cross_engine"]
        assert verdict["verdict"] == "pass" and int(verdict["message"].split()[0]) > 0, verdict
        assert "golden request(s) agree with the other engine (0 ties)" in verdict["message"], verdict


def smoke_rows(tmp_path: Path, matrix: str) -> dict[str, dict]:
    from harness.cli.main import main

    report = tmp_path / "out"
    code = main(["run", "--matrix", matrix, "--report-dir", str(report)])
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    statuses = {row["cell_id"]: row["status"] for row in rows}
    assert running_servers(report) == [], "a server outlived its cell"
    assert code == 0 and set(statuses.values()) <= {"pass", "xfail"}, statuses
    assert all(Path(log).is_file() for row in rows for log in row["metrics"].get("server_logs", []))
    return {row["cell_id"]: row for row in rows}


def declared_here(matrix: str, rows: dict[str, dict]) -> dict[str, list[int]]:
    """cell → the ``[[expected]]`` entries (their numbers) that apply to it on this host, read from the matrix file
    and this CPU's flags; every row's verdict is the one they give: ``xfail`` where one applies (with those entries
    and the declared error's type where it is one), ``pass`` where none does. Never "every cell passes": a cell of a
    kernel path this host takes and another does not is judged by the declarations of the host it ran on."""
    loaded, flags = load_matrix(matrix), cpu_flags()
    applying = {}
    for cell_id, row in rows.items():
        numbers = [entry.number for entry in loaded.expected if entry.matches(row["factors"], flags)]
        applying[cell_id] = numbers
        assert row["status"] == ("xfail" if numbers else "pass"), (cell_id, numbers, row["status"], row.get("error"))
        if numbers:
            recorded = [decl["number"] for decl in row["expected"]["declarations"]]
            assert recorded == numbers, (cell_id, recorded, numbers)
            errors = [name[len("error: "):] for name in row["expected"]["fails"] if name.startswith("error: ")]
            assert not errors or error_type(row["error"]) in errors, (cell_id, row["error"])
    return applying


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM at a time
def test_the_vllm_server_smoke_matrix_runs_to_verdicts(tmp_path: Path) -> None:
    needs_vllm()
    rows = smoke_rows(tmp_path, "vllm_server_smoke")
    statuses = {cell: row["status"] for cell, row in rows.items()}
    assert len(statuses) == 4 and list(statuses.values()) == ["pass"] * 4, statuses
    # the PD cell: every request crossed from the prefill server to the decode server, each side's ledger adding up
    (pd,) = [row for row in rows.values() if row["factors"]["pd"] == "nixl"]
    audit = pd["oracles"]["pd_audit"]
    assert audit["verdict"] == "pass" and int(audit["message"].split()[0]) > 0, audit
    # and every cell was read back from the server it ran on
    assert all(row["metrics"]["applied"]["page_size"] == 32 for row in rows.values()), rows
    agrees_with_the_reference(rows)


@pytest.mark.llamacpp
@pytest.mark.slow
@pytest.mark.xdist_group("llamacpp")  # one llama-server at a time
def test_the_llamacpp_smoke_matrix_runs_to_verdicts(tmp_path: Path) -> None:
    needs_llama_server()
    rows = smoke_rows(tmp_path, "llamacpp_smoke")
    statuses = {cell: row["status"] for cell, row in rows.items()}
    assert len(statuses) == 6 and "pass" in statuses.values() and "xfail" in statuses.values(), statuses
    # judged by llama.cpp's own slot rule: cached_tokens passes every cache-on cell with nothing excused, and the row
    # shows what the server applied, read back from it
    cache_on = [row for row in rows.values() if row["factors"]["cache"] == "device"]
    assert cache_on and all(row["oracles"]["cached_tokens"]["verdict"] == "pass"
                            and not row["oracles"]["cached_tokens"].get("excused") for row in cache_on), statuses
    assert all(row["metrics"]["applied"]["slots"] == row["factors"]["slots"] for row in rows.values())
    agrees_with_the_reference(rows)
