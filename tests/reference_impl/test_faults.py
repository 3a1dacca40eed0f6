"""Every registered fault fails exactly its trigger cells, through the oracle it names, and nothing else."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.rows import error_type
from harness.run.faultcheck import _seen, check_fault
from harness.matrix.model import Matrix
from harness.matrix.file import load_matrix
from harness.results.rows import CellResult
from harness.run.golden import GoldenRuns
from reference_impl.faults import FAULTS

#: pool × backend × deterministic × poison around every unified-pool and Triton fault, on the
#: cheapest workload that has a cold→warm hit and a page re-issued with an unwritten tail.
KERNEL_FAULTS = """
[matrix]
name = "kernel_faults"
mode = "full"
workloads = ["pair"]

[factors]
model = ["dense"]
pool = ["static", "unified"]
backend = ["torch", "triton"]
deterministic = ["off", "on"]
poison = ["off", "on"]
cache = ["device"]
page_size = [16]
"""

SCHEDULER_FAULTS = """
[matrix]
name = "scheduler_faults"
mode = "full"
workloads = ["burst"]

[factors]
model = ["dense", "hybrid"]
scheduler = ["fcfs", "priority"]
cache = ["off", "device"]
page_size = [16]
"""

#: every proposer with every cache, on the workload whose warm pass hits prompts. 2-wise: each trigger of
#: these faults is at most a pair of levels, so every trigger combination runs (16 cells, not 32).
SPEC_FAULTS = """
[matrix]
name = "spec_faults"
mode = "t-wise"
strength = 2
workloads = ["system_prompt"]

[factors]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft", "mtp"]
cache = ["off", "device", "host", "storage"]
page_size = [16]
"""

#: every proposer and model on text that repeats (every step has a prompt-lookup match).
NGRAM_FAULTS = """
[matrix]
name = "ngram_faults"
mode = "full"
workloads = ["repeated_phrases"]

[factors]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft", "mtp"]
cache = ["device"]
page_size = [16]
deterministic = ["off"]
"""

#: every cache tier on the workload that serves its prompts again from a second tenant and a second engine.
TENANT_FAULTS = """
[matrix]
name = "tenant_faults"
mode = "full"
workloads = ["isolation"]

[factors]
model = ["dense"]
cache = ["off", "device", "host", "storage"]
page_size = [16]
"""


def structured_faults(name: str, workload: str) -> str:
    """Both models over every cache on one structured workload (chunks under two heads, a split, starved slots)."""
    return f"""
[matrix]
name = "{name}"
mode = "full"
workloads = ["{workload}"]

[factors]
model = ["dense", "hybrid"]
cache = ["off", "device", "host", "storage"]
page_size = [16]
"""


#: a request holding a matched prefix while a burst evicts around it: every cache with both models and with
#: both page sizes (2-wise: the trigger is one factor).
LOCK_FAULTS = """
[matrix]
name = "lock_faults"
mode = "t-wise"
strength = 2
workloads = ["locked_prefix"]

[factors]
model = ["dense", "hybrid"]
cache = ["off", "device", "host", "storage"]
page_size = [1, 16]
"""

#: every proposer and model on a workload whose decoding outgrows its pool (preemption while speculating).
PREEMPT_FAULTS = """
[matrix]
name = "preempt_faults"
mode = "full"
workloads = ["spec_preempt"]

[factors]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft", "mtp"]
cache = ["device"]
page_size = [16]
deterministic = ["off"]
"""

#: every proposer, with and without the cache, on the cheapest workload that decodes.
LEAK_FAULTS = """
[matrix]
name = "leak_faults"
mode = "full"
workloads = ["pair"]

[factors]
model = ["dense"]
spec = ["none", "ngram", "draft", "mtp"]
cache = ["off", "device"]
page_size = [16]
"""

#: every cache × proposer and cache × model pair, on the workload whose warm pass reloads each tail from L2
#: (also under L3). 2-wise, as SPEC_FAULTS.
TIER_FAULTS = """
[matrix]
name = "tier_faults"
mode = "t-wise"
strength = 2
workloads = ["spill_host"]

[factors]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft", "mtp"]
cache = ["off", "device", "host", "storage"]
page_size = [16]
"""

#: PD around the KV faults, on the cheapest workload with a decode-side hit (pair: one shared 16-token
#: page, a whole chunk at prefill_budget 16) and prompts over one chunk (28 tokens, chunks of 16).
PD_GRID_FAULTS = """
[matrix]
name = "pd_grid_faults"
mode = "full"
workloads = ["pair"]

[factors]
pd = ["inproc"]
pd_staging = ["off", "on"]
model = ["dense", "hybrid"]
cache = ["off", "device"]
prefill_budget = [16, 128]
page_size = [16]
"""

#: both pools, with and without PD, both models and chunk sizes, staging or not.
PD_POOL_FAULTS = """
[matrix]
name = "pd_pool_faults"
mode = "full"
workloads = ["pair"]

[factors]
pd = ["off", "inproc"]
pd_staging = ["off", "on"]
pool = ["static", "unified"]
model = ["dense", "hybrid"]
prefill_budget = [16, 128]
cache = ["device"]
page_size = [16]
"""

#: PD around hybrid prefill, at a small and the largest budget, on a prompt that spans chunks at both.
PD_STATE_FAULTS = """
[matrix]
name = "pd_state_faults"
mode = "full"
workloads = ["split_kv"]

[factors]
pd = ["off", "inproc"]
model = ["dense", "hybrid"]
prefill_budget = [16, 128]
cache = ["device"]
page_size = [16]
"""

#: every proposer over both pools, on the workload whose requests decode enough to verify.
PD_SPEC_FAULTS = """
[matrix]
name = "pd_spec_faults"
mode = "full"
workloads = ["system_prompt"]

[factors]
pd = ["inproc"]
spec = ["none", "ngram", "draft", "mtp"]
pool = ["static", "unified"]
cache = ["device"]
page_size = [16]
prefill_budget = [32]
"""

#: the workload that frees decode pages under a transfer in flight, both pools and page sizes.
PD_CHURN_FAULTS = """
[matrix]
name = "pd_churn_faults"
mode = "full"
workloads = ["pd_churn"]

[factors]
pd = ["inproc"]
pool = ["static", "unified"]
page_size = [1, 16]
cache = ["device"]
prefill_budget = [32]
"""

#: every proposer with and without PD over both models, on the cheapest workload: the prefill side's scratch.
PD_SCRATCH_FAULTS = """
[matrix]
name = "pd_scratch_faults"
mode = "full"
workloads = ["pair"]

[factors]
pd = ["off", "inproc"]
spec = ["none", "ngram", "draft", "mtp"]
model = ["dense", "hybrid"]
cache = ["device"]
page_size = [16]
prefill_budget = [32]
"""

#: lost chunks or none, with and without PD, over every cache, on prompts of several chunks (aborts happen there).
PD_ABORT_FAULTS = """
[matrix]
name = "pd_abort_faults"
mode = "full"
workloads = ["long_prompts"]

[factors]
pd = ["off", "inproc"]
pd_fail_rate = [0.0, 0.2]
cache = ["off", "device", "host", "storage"]
model = ["dense"]
page_size = [16]
prefill_budget = [32]
"""

#: chunk ends on and off the page grid: deterministic or not, at both page sizes, an off-grid and the largest budget
#: (long_prompts: three prompts share one step's budget, so even 128 cuts inside a page).
PD_PARTIAL_FAULTS = """
[matrix]
name = "pd_partial_faults"
mode = "full"
workloads = ["long_prompts"]

[factors]
pd = ["off", "inproc"]
pd_staging = ["off", "on"]
deterministic = ["off", "on"]
page_size = [1, 16]
prefill_budget = [24, 128]
cache = ["device"]
model = ["dense"]
"""

#: every cache, both models and page sizes, on the workload where L2 pressure follows L1 demoting a shared head.
DEMOTE_FAULTS = """
[matrix]
name = "demote_faults"
mode = "full"
workloads = ["demoted_head"]

[factors]
model = ["dense", "hybrid"]
cache = ["off", "device", "host", "storage"]
page_size = [1, 16]
"""

#: every proposer and model at the default k, below it and above it (the chain wraps past three steps), on the
#: workloads whose drafts run longest (repeated text, long prompts).
CHAIN_FAULTS = """
[matrix]
name = "chain_faults"
mode = "full"
workloads = ["long_prompts", "repeated_phrases"]

[factors]
spec = ["none", "ngram", "draft", "mtp"]
model = ["dense", "hybrid"]
num_draft_tokens = [3, 2, 5]
cache = ["device"]
page_size = [16]
deterministic = ["off"]

[[constraints]]
forbid = { spec = "none", num_draft_tokens = [2, 5] }
reason = "no k without a proposer"
"""

#: every cache, model and proposer at both page sizes, on the workload served one request at a time under pressure
#: (the independent cache model is exact there for a dense model without a proposer). 2-wise, with the trigger's
#: three factors 3-wise.
LEAF_FAULTS = """
[matrix]
name = "leaf_faults"
mode = "t-wise"
strength = 2
workloads = ["leaf_pressure"]

[factors]
cache = ["off", "device", "host", "storage"]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft", "mtp"]
page_size = [1, 16]

[[stronger]]
factors = ["cache", "model", "spec"]
strength = 3
"""

#: every cache, model and proposer at page sizes 1 and 16 on the boundary family alone (issue 42): only a draw whose prompt
#: is an exact page multiple, asked for again, shows the fault; no fixed workload runs. 2-wise, the trigger 3-wise.
BOUNDARY_FAULTS = """
[matrix]
name = "boundary_faults"
mode = "t-wise"
strength = 2
workloads = []

[factors]
cache = ["off", "device", "host", "storage"]
model = ["dense", "hybrid"]
spec = ["none", "ngram", "draft"]
page_size = [1, 16]

[[stronger]]
factors = ["cache", "model", "page_size"]
strength = 3

[boundary]
draws = 2
"""

MATRIX_OF = {
    "priority_scheduler_drop": SCHEDULER_FAULTS,
    "unified_extend_virtual_loc": KERNEL_FAULTS,
    "unified_no_zero_on_issue": KERNEL_FAULTS,
    "slot_stride_int32": KERNEL_FAULTS,
    "draft_state_not_cached": SPEC_FAULTS,
    "mtp_layer_index_oob": SPEC_FAULTS,
    "hicache_draft_not_restored": TIER_FAULTS,
    "mamba_whole_block_offload": TIER_FAULTS,
    "ngram_prompt_only": NGRAM_FAULTS,
    "tenant_namespace_dropped": TENANT_FAULTS,
    "page_key_forgets_prefix": structured_faults("key_faults", "templated"),
    "draft_pages_kept_on_preempt": PREEMPT_FAULTS,
    "split_snapshot_to_head": structured_faults("split_faults", "snapshot_split"),
    "spec_finish_page_leak": LEAK_FAULTS,
    "evict_ignores_lock": LOCK_FAULTS,
    "pd_staging_grid_shift": PD_GRID_FAULTS,
    "pd_virtual_ids_on_wire": PD_POOL_FAULTS,
    "pd_mamba_state_early": PD_STATE_FAULTS,
    "pd_compaction_in_flight": PD_CHURN_FAULTS,
    "pd_draft_state_not_sent": PD_SPEC_FAULTS,
    "pd_prefill_verify_scratch": PD_SCRATCH_FAULTS,
    "pd_abort_caches_pages": PD_ABORT_FAULTS,
    "pd_partial_page_early": PD_PARTIAL_FAULTS,
    "host_demotes_as_oldest": DEMOTE_FAULTS,
    "draft_chain_default_steps": CHAIN_FAULTS,
    "evict_counts_leaves": LEAF_FAULTS,
    "full_hit_last_token_only": BOUNDARY_FAULTS,
}


def fault_matrix(fault: str, tmp_path: Path) -> Matrix:
    """The matrix ``fault`` is checked on, written where load_matrix wants it (the file named as the matrix)."""
    text = MATRIX_OF[fault]
    name = text.split('name = "')[1].split('"')[0]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return load_matrix(str(path))


@pytest.fixture(scope="module")
def goldens() -> GoldenRuns:
    return GoldenRuns()


def test_every_fault_has_a_check() -> None:
    assert set(MATRIX_OF) == set(FAULTS)


#: fault checks over a minute of CPU under load (``make test`` runs them; ``-m "not slow"`` leaves them out).
SLOW_CHECKS = {"ngram_prompt_only", "draft_pages_kept_on_preempt", "draft_chain_default_steps"}


@pytest.mark.parametrize("fault", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_CHECKS else f for f in sorted(FAULTS)])
def test_fault_fails_exactly_its_trigger_cells(fault: str, tmp_path: Path, goldens: GoldenRuns) -> None:
    check = check_fault(fault_matrix(fault, tmp_path), fault, goldens)
    assert check.triggered, "the matrix has no trigger cell for this fault"
    assert check.triggered != set(), check
    assert not check.missed, f"{fault} went unseen on {sorted(check.missed)}"
    assert not check.spurious, f"{fault} failed cells it cannot reach: {sorted(check.spurious)}"
    assert not check.wrong_oracle, f"{fault} not seen by {FAULTS[fault].oracle} on {sorted(check.wrong_oracle)}"


def test_an_error_fault_is_seen_only_through_the_exception_it_names() -> None:
    fault = FAULTS["mtp_layer_index_oob"]
    assert fault.exception == "IndexError"

    def errored(last_line: str) -> CellResult:
        trace = f"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n{last_line}"
        return CellResult(cell_id="c", matrix="m", factors={}, status="error", error=trace)

    assert error_type(errored("IndexError: tuple index out of range").error) == "IndexError"
    assert error_type(errored("reference_impl.memory.static.PoolIntegrityError: page 3 freed while not live").error) == "PoolIntegrityError"
    assert _seen(errored("IndexError: tuple index out of range"), fault)
    assert not _seen(errored("ValueError: MTP layer 4 must be attention"), fault)
    assert not _seen(errored("harness.run.runner.CellTimeout: cell exceeded its timeout of 1 s"), fault)
    assert not _seen(CellResult(cell_id="c", matrix="m", factors={}, status="fail"), fault)


#: levels a fault's check matrix must cover for each trigger factor that is not a component (switches, values).
VALUE_DOMAINS = {"deterministic": {"off", "on"}, "poison": {"off", "on"}, "pd_staging": {"off", "on"},
                 "page_size": {1, 16}, "prefill_budget": {16, 128}, "pd_fail_rate": {0.0, 0.2},
                 "num_draft_tokens": {2, 3, 5}}
#: (fault, factor): why its check matrix leaves a level out (each is covered elsewhere, as said).
UNCOVERED = {
    ("unified_no_zero_on_issue", "page_size"): "Triton under the CPU interpreter at page size 1 takes minutes a "
    "cell; the pools and nightly matrices cross it, and the kill benchmark runs it",
    ("pd_staging_grid_shift", "cache"): "host and storage: the decode-side hit that shifts the grid comes from the "
    "decode side's L1 tree, the same under every cache; pd.toml crosses them (PD matrices are the PD owner's)",
    **{(name, "pd"): "nixl and mooncake: a decode child process per cell; pd.toml crosses them 3-wise (PD faults and "
       "their matrices are the PD owner's)" for name in FAULTS if name.startswith("pd_")},
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_matrix_covers_every_level_of_its_trigger_factors(fault: str, tmp_path: Path) -> None:
    from harness.sut.reference import LEVELS
    from reference_impl import registry

    matrix = fault_matrix(fault, tmp_path)
    for factor in FAULTS[fault].triggers:
        domain = set(registry.COMPONENTS.get(factor, {})) or VALUE_DOMAINS[factor]
        levels = set(dict(matrix.factors).get(factor, (LEVELS.defaults[factor],)))
        missing = domain - levels
        assert not missing or (fault, factor) in UNCOVERED, f"{fault}: its matrix lacks {factor} = {sorted(missing, key=str)}"
