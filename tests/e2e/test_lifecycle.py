"""Nothing outlives the harness: stopped by SIGINT, SIGTERM or SIGHUP, killed outright, or with a worker killed, at
-j 1 and -j 2, no process a run started is alive once the run has ended, and ``--resume`` then completes the run
with every cell exactly once.

A run's processes are found by a marker in their environment (set in the harness's, inherited by its workers, its
servers, their children and the watchdogs), not by name. The stand-in server (tests/servers/fake_server.py) forks
a worker of its own and answers slowly, so a signal lands while cells are serving (alone, and as PD pairs: two
servers a cell); the same tests run on
llama.cpp's llama-server where it is built (``make llama-server``; marker ``llamacpp``), and a vLLM child is
stopped and killed where vLLM is installed (``make vllm-env``; markers ``vllm`` and ``slow``: it starts for minutes).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.sut import vllm
from harness.sut.openai import launch
from harness.sut.vllm import protocol as vllm_protocol
from harness.sut.process import STOP_GRACE_S, is_live
from tests.binaries import required_path

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "servers" / "fake_server.py"
MARK_ENV = "KVMATRIX_LIFECYCLE_MARK"
#: seconds the helpers of a run that ended (forkserver, resource tracker) get to notice and leave, on a loaded machine
SETTLE_S = 20
pytestmark = pytest.mark.lifecycle

#: three cells: the golden configuration (its golden run reused) and two that start servers of their own, so that
#: both workers of -j 2 hold a server when the signal comes.
SERVER_MATRIX = """
[matrix]
name = "lifecycle"
engine = "openai"
mode = "full"
workloads = ["pair"]
timeout_s = 120

[factors]
model = ["{model}"]
slots = [1, 2, 3]

[golden]
slots = 1

[server]
api = "{api}"
command = {command}
health = "/health"
start_timeout_s = 60
{extra}

[server.levels.slots]
flags = [{slots_flags}]
"""
#: one cell, vLLM's golden configuration: its golden run is the child the signal finds importing vllm.
VLLM_MATRIX = """
[matrix]
name = "lifecycle"
engine = "vllm"
mode = "full"
workloads = ["pair"]
timeout_s = 600

[factors]
cache = ["off"]

# what vLLM 0.32 does to every offline caller's SamplingParams (matrices/vllm.toml declares it)
[[expected]]
when = { cache = "off" }
fails = "inputs"
signature = { field = "sampling_params.output_kind" }
class = "engine bug"
reason = "LLM._add_request sets the caller's SamplingParams.output_kind in place"
"""


@dataclass(frozen=True)
class Server:
    """What a run's cells start (its program, found on a process's command line) and the matrix that starts it."""

    program: str
    matrix: str


def fake_server(tmp_path: Path) -> Server:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # a checkpoint of its own: no cross_engine reference serves it
    command = [sys.executable, str(FAKE), "{port}", "slow:0.5", str(tmp_path / "pids"), "{checkpoint}"]
    return Server(str(FAKE), SERVER_MATRIX.format(model=model, api="openai", command=json.dumps(command),
                                                  slots_flags='"--slots={level}"', extra=""))


def fake_pd_pair(tmp_path: Path) -> Server:
    """The stand-in's cells alone and as PD pairs (``pd = nixl``: two server groups a cell, both to be stopped)."""
    server = fake_server(tmp_path)
    pd = ('\n[server.pd]\nhandoff = "kv_transfer_params"\nrequest = { max_tokens = 1, kv_transfer_params = '
          '{ do_remote_decode = true } }\n[server.pd.levels.nixl]\nprefill = { flags = ["--role=prefill"] }\n'
          'decode = { flags = ["--role=decode"] }\n')
    matrix = server.matrix.replace("slots = [1, 2, 3]\n", 'slots = [1, 2, 3]\npd = ["off", "nixl"]\n', 1)
    return Server(server.program, matrix.replace("\n[server.levels.slots]", pd + "\n[server.levels.slots]", 1))


def llama_server(tmp_path: Path) -> Server:
    binary = required_path(launch.llama_server_path(), "llama-server")
    command = ["{llama_server}", "-m", "{gguf}", "--host", "{host}", "--port", "{port}", "-c", "2048"]
    return Server(str(binary), SERVER_MATRIX.format(model="dense", api="llamacpp", command=json.dumps(command),
                                                    slots_flags='"-np", "{level}"',
                                                    extra="request = { cache_prompt = false }  # no cache factor here"))


def vllm_child(tmp_path: Path) -> Server:
    required_path(vllm.vllm_python(), "vllm-env")
    return Server(str(vllm_protocol.CHILD), VLLM_MATRIX)


#: llama-server under make test's --dist loadgroup: one llama-server at a time (as tests/e2e/test_real_servers.py)
SERVERS = {"fake": (fake_server, ()), "fake-pd": (fake_pd_pair, ()),
           "llamacpp": (llama_server, (pytest.mark.llamacpp, pytest.mark.xdist_group("llamacpp")))}


def marked(mark: str) -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, command line) of every live process whose environment holds ``mark`` (this one aside)."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text().rpartition(")")[2].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if is_live(int(proc.name)):
            found.append((int(proc.name), int(stat[1]), int(stat[2]), cmdline))
    return found


def servers(mark: str, server: Server) -> list[tuple[int, int, int, str]]:
    """The live servers of a run: leaders of their own process groups running ``server``'s program."""
    return [p for p in marked(mark) if p[0] == p[2] and server.program in p[3]]


def gone(mark: str, within_s: float) -> list[str]:
    """Wait up to ``within_s`` for no process with ``mark`` to be left; the command lines of those that are."""
    deadline = time.monotonic() + within_s
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{pid} (parent {ppid}, group {pgid}): {cmd}" for pid, ppid, pgid, cmd in left]


@dataclass(frozen=True)
class Stop:
    """How a run is stopped, and what the harness must answer."""

    signum: int
    to_group: bool  # sent to the harness's process group (a terminal's Ctrl-C, a hang-up), else to one process
    code: int | None  # the harness's exit status; None: killed
    worker: bool = False  # sent to the process that started a server (at -j 1 the harness itself)


STOPS = {
    "SIGINT": Stop(signal.SIGINT, to_group=True, code=130),
    "SIGTERM": Stop(signal.SIGTERM, to_group=False, code=143),
    "SIGHUP": Stop(signal.SIGHUP, to_group=True, code=129),
    "SIGKILL": Stop(signal.SIGKILL, to_group=False, code=None),
    "SIGKILL-worker": Stop(signal.SIGKILL, to_group=False, code=1, worker=True),
}


def harness(args: list[str], env: dict[str, str], out: Path) -> subprocess.Popen:
    """``python -m harness ARGS`` in a session of its own (as a terminal's job), SIGHUP heard even under nohup."""
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=(out / "stdout").open("a"), stderr=(out / "stderr").open("w"),
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))


def wait_for_servers(run: subprocess.Popen, mark: str, server: Server, count: int) -> list[tuple[int, int, int, str]]:
    """Poll until ``count`` servers of the run serve at once (the run must not end first)."""
    deadline = time.monotonic() + 120
    while len(up := servers(mark, server)) < count:
        assert run.poll() is None, "the run ended before its servers were up"
        assert time.monotonic() < deadline, f"{count} server(s) never up at once"
        time.sleep(0.05)
    return up


def stop(run: subprocess.Popen, how: Stop, up: list[tuple[int, int, int, str]]) -> int:
    """Deliver ``how``; the pid it went to."""
    target = up[0][1] if how.worker else run.pid
    if how.to_group:
        os.killpg(run.pid, how.signum)
    else:
        os.kill(target, how.signum)
    return target


#: the PD pairs' own risk is a second server group per cell: a stop heard at -j 2 (four groups up), the harness
#: killed (their watchdogs) and a worker killed; the stand-in alone and llama-server take every stop at both -j
PD_STOPS = (("SIGINT", 2), ("SIGKILL", 1), ("SIGKILL-worker", 2))


def stopped_runs() -> list[object]:
    """(server, stop, jobs) cases: every stop at -j 1 and -j 2 for one server group a cell, PD_STOPS for pairs."""
    cases = []
    for name, (make_server, marks) in SERVERS.items():
        for stop_name in STOPS:
            for jobs in (1, 2):
                if name != "fake-pd" or (stop_name, jobs) in PD_STOPS:
                    cases.append(pytest.param(make_server, stop_name, jobs, marks=marks, id=f"{name}-{stop_name}-{jobs}"))
    return cases


@pytest.mark.parametrize(("make_server", "stop_name", "jobs"), stopped_runs())
def test_nothing_outlives_a_stopped_run_and_resume_completes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                make_server: Callable[[Path], Server], stop_name: str,
                                                                jobs: int) -> None:
    check_leaves_nothing(tmp_path, monkeypatch, make_server(tmp_path), stop_name, jobs)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")
@pytest.mark.parametrize("stop_name", ["SIGTERM", "SIGKILL"])
def test_nothing_outlives_a_stopped_vllm_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_name: str) -> None:
    """The vLLM child (engine = "vllm"), stopped while it imports vllm: it and whatever it started are gone."""
    check_leaves_nothing(tmp_path, monkeypatch, vllm_child(tmp_path), stop_name, 1)


def check_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: Server, stop_name: str,
                         jobs: int) -> None:
    """Stop a run of ``server``'s matrix by ``stop_name`` and resume it, killing whatever a failure leaves."""
    path = tmp_path / "lifecycle.toml"
    path.write_text(server.matrix)
    mark = uuid.uuid4().hex
    try:
        check_stopped_then_resumed(tmp_path, monkeypatch, path, server, stop_name, jobs, mark)
    finally:  # a failure leaves nothing behind either
        for pid, *_ in marked(mark):
            os.kill(pid, signal.SIGKILL)


def check_stopped_then_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Path, server: Server,
                               stop_name: str, jobs: int, mark: str) -> None:
    """Run ``path`` at ``-j jobs`` with ``mark``, stop it by ``stop_name`` once ``jobs`` servers serve, check that
    nothing is left, resume it, and check that each cell has one row."""
    how = STOPS[stop_name]
    cells = [cell.cell_id for cell in generate(load_matrix(str(path)))]
    env = {**os.environ, MARK_ENV: mark, "PYTHONPATH": str(ROOT)}
    if jobs > 1:  # the stand-in's cell servers wait for each other (after the golden one): both serve when it stops
        env["KVMATRIX_FAKE_MEET"] = str(1 + jobs)
    report = tmp_path / "out"
    command = ["run", "--matrix", str(path), "--report-dir", str(report)]
    run = harness([*command, "-j", str(jobs)], env, tmp_path)
    up = wait_for_servers(run, mark, server, jobs)
    target = stop(run, how, up)
    code = run.wait(timeout=120)
    killed_harness = how.signum == signal.SIGKILL and target == run.pid
    err = (tmp_path / "stderr").read_text()

    assert code == (-signal.SIGKILL if killed_harness else how.code), err
    if how.signum != signal.SIGKILL:  # stopped, not killed: everything stopped before it exited, one line said so
        assert [p for p in marked(mark) if server.program in p[3]] == [], "a server outlived the run"
        assert err.count("\n") == 1 and err.startswith(f"interrupted by {stop_name}: "), err
        if jobs == 1:  # stopped at the golden run's server: before the first row, nothing kept, no traceback
            assert f"0 of {len(cells)} cells kept" in err, err
    # what is left exits once it sees the run is gone (a forkserver, a resource tracker, the watchdogs of killed
    # starters, which give a group STOP_GRACE_S after SIGTERM); SETTLE_S is for a machine under load: a process
    # that would outlive the run stays far longer
    assert gone(mark, STOP_GRACE_S + SETTLE_S if how.signum == signal.SIGKILL else SETTLE_S) == []

    monkeypatch.setenv(MARK_ENV, mark)  # the resume runs here (no second start of torch): its servers carry the mark
    assert main([*command, "--resume", "-j", "1"]) == (1 if how.worker and not killed_harness else 0)
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert sorted(r["cell_id"] for r in rows) == sorted(cells)
    died = [r for r in rows if r["status"] == "error"]
    judged = "xfail" if "[[expected]]" in path.read_text() else "pass"  # the vLLM matrix declares its output_kind
    assert [r["status"] for r in rows if r not in died] == [judged] * (len(cells) - len(died))
    assert len(died) == (1 if how.worker and not killed_harness else 0), [r["error"] for r in died]
    assert all("worker process died (exit code -9)" in r["error"] for r in died)
    assert gone(mark, SETTLE_S) == []


#: a starter that dies by SIGKILL at the start of a group's watchdog: just after the leader was started
KILLED_BEFORE_THE_WATCHDOG = """
import os, signal, subprocess, sys
from harness.sut.process import ProcessGroup
started = []
def popen(*args, _popen=subprocess.Popen, **kwargs):
    if started:
        os.kill(os.getpid(), signal.SIGKILL)
    started.append(args)
    return _popen(*args, **kwargs)
subprocess.Popen = popen
ProcessGroup(["/bin/sh", "-c", "touch " + sys.argv[1] + "; exec sleep 120"], {})
"""


def test_a_starter_killed_before_its_watchdog_runs_starts_nothing(tmp_path: Path) -> None:
    """SIGKILL cannot be held off: a starter killed between starting a group and its watchdog leaves no process,
    because the program runs only once the watchdog does (before the gate, the program was left to init)."""
    mark, ran = uuid.uuid4().hex, tmp_path / "ran"
    starter = subprocess.run([sys.executable, "-c", KILLED_BEFORE_THE_WATCHDOG, str(ran)], cwd=ROOT, timeout=120,
                             env={**os.environ, MARK_ENV: mark, "PYTHONPATH": str(ROOT)}, capture_output=True)
    try:
        assert starter.returncode == -signal.SIGKILL, starter.stderr.decode()
        assert gone(mark, SETTLE_S) == []
        assert not ran.exists(), "the program ran without a watchdog"
    finally:
        for pid, *_ in marked(mark):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_command_line_loads_is_one_line(tmp_path: Path, signum: int) -> None:
    """torch takes seconds to import: a stop signal then still ends the command with 128 + signal and one line."""
    run = harness(["list", "--matrix", "smoke"], dict(os.environ), tmp_path)
    time.sleep(0.5)
    os.kill(run.pid, signum)
    assert run.wait(timeout=60) == 128 + signum
    err = (tmp_path / "stderr").read_text()
    assert err.count("\n") == 1 and err.startswith(f"interrupted by {signal.Signals(signum).name}"), err


def test_a_stop_signal_or_a_deadline_waits_for_a_group_to_start_and_a_signal_is_raised_once() -> None:
    """What keeps a group from being half-started: the signal (or the cell's deadline) is held until the block ends."""
    from harness.run.serve import CellTimeout, deadline
    from harness.sut.interrupt import Interrupted, stop_on_signals, uninterrupted

    done = []
    with stop_on_signals():
        with pytest.raises(Interrupted) as raised:
            with uninterrupted():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                done.append("started")
        os.kill(os.getpid(), signal.SIGTERM)  # while the first one unwinds: noted, not raised
        time.sleep(0.2)
    assert done == ["started"] and raised.value.exit_code == 143
    with pytest.raises(CellTimeout):
        with deadline(0.05):
            with uninterrupted():
                time.sleep(0.3)
                done.append("stopped")
            time.sleep(1)
    assert done == ["started", "stopped"]
