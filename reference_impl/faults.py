"""Named faults: each a faithful model of one real incident, off by default, zero cost when off.

A fault is switched on per engine (``EngineConfig.faults``); the code path it breaks checks
``name in config.faults`` on that path only. Each entry states the incident it models,
the factor levels that trigger it and the oracle expected to see it, so the harness can
check that injecting it fails exactly the trigger cells, through that oracle.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    """One injectable bug: what it models and where it must be seen."""

    name: str
    incident: str
    triggers: Mapping[str, tuple[object, ...]]  # a cell is a trigger cell when every factor listed has one of these levels
    oracle: str  # the oracle that must fail on trigger cells ("error" when the cell must crash)
    doc: str

    def triggered_by(self, factors: Mapping[str, object]) -> bool:
        """Whether a cell with these factor levels exercises the broken path."""
        return all(factors.get(name) in levels for name, levels in self.triggers.items())


PRIORITY_SCHEDULER_DROP = Fault(
    name="priority_scheduler_drop",
    incident="vLLM #49206: the PRIORITY scheduler silently skips requests",
    triggers={"scheduler": ("priority",)},
    oracle="completeness",
    doc=(
        "When the priority queue passes over a request that does not fit the pool this step "
        "(letting a smaller one behind it run), the passed-over request is never put back: it "
        "never runs, never errors, and the run ends one request short."
    ),
)

UNIFIED_EXTEND_VIRTUAL_LOC = Fault(
    name="unified_extend_virtual_loc",
    incident="SGLang #33517: unified pool × Triton backend × deterministic inference read extend KV by a virtual id",
    triggers={"pool": ("unified",), "backend": ("triton",), "deterministic": ("on",)},
    oracle="tokens",
    doc=(
        "Deterministic mode routes Triton extend to the single-stage kernel that reads the new "
        "tokens' K/V back from the pool; it is handed the untranslated (virtual) out_cache_loc while "
        "the prefix indices are physical. Any two of the three factors are fine: the static pool's "
        "ids are physical, the two-stage kernel reads new K/V from its inputs, torch has no such kernel."
    ),
)

UNIFIED_NO_ZERO_ON_ISSUE = Fault(
    name="unified_no_zero_on_issue",
    incident="SGLang #33974 root cause 1: the unified pool does not zero a recycled page when it is issued",
    triggers={"pool": ("unified",), "poison": ("on",), "backend": ("triton",), "page_size": (2, 4, 8, 16, 32, 64)},
    oracle="nan",
    doc=(
        "A re-issued page keeps its old bytes (NaN under poison) in the tail slots the request has "
        "not written yet; the Triton kernels read whole pages and mask with arithmetic, and "
        "NaN × 0 = NaN. Static pools, the torch backend (reads exactly seq_len slots), poison off "
        "(no NaN to leak) and page_size 1 (no tail: every page is full) never show it."
    ),
)

SLOT_STRIDE_INT32 = Fault(
    name="slot_stride_int32",
    incident="SGLang #33974 root cause 2: slot × stride folded into int32 wraps once ids grow under load",
    triggers={"pool": ("unified",), "backend": ("triton",)},
    oracle="pool_audit",
    doc=(
        "The Triton kernels compute page × page_stride in 32-bit arithmetic. Exact on a test-sized "
        "pool; the launch-geometry audit (reference_impl.attention.launch_audit) finds that at a 24 GiB KV "
        "budget the unified pool's envelope stride (every layer per page) wraps past 2**31 while "
        "every static layout still fits: unified-only and load-only, as in the seed. The torch "
        "backend does no such arithmetic."
    ),
)

DRAFT_STATE_NOT_CACHED = Fault(
    name="draft_state_not_cached",
    incident="SGLang #30393 (device-tier form): the radix cache keeps the target's KV but not the draft state",
    triggers={"spec": ("draft", "mtp"), "cache": ("device",)},
    oracle="accept_length",
    doc=(
        "When a finished prompt's pages enter the prefix cache, the draft pool's K/V of those pages is "
        "dropped; a later hit restores the target's K/V (tokens and cached_tokens stay right) while the "
        "draft reads nothing where its context should be, so its proposals and the accept length collapse. "
        "Stateless proposers (none, ngram) and cache=off never show it."
    ),
)

MTP_LAYER_INDEX_OOB = Fault(
    name="mtp_layer_index_oob",
    incident="vLLM #49642: the MTP layer's index (num_layers) used on a per-layer table of length num_layers",
    triggers={"spec": ("mtp",)},
    oracle="error",
    doc=(
        "Loading the MTP layer looks its layer kind up in the model's per-layer table without the bounds "
        "check: index num_layers is one past the end, an IndexError at load, so the cell is an error. "
        "Only spec=mtp has a layer past the base layers; every model here has the per-layer table."
    ),
)

HICACHE_DRAFT_NOT_RESTORED = Fault(
    name="hicache_draft_not_restored",
    incident="SGLang #30393: host/storage cache tiers move only the target KV, not the draft state",
    triggers={"spec": ("draft", "mtp"), "cache": ("host", "storage")},
    oracle="accept_length",
    doc=(
        "A page loaded back from a lower tier gets the target's K/V but not the draft's (draft pool or MTP "
        "tail layer): tokens and cached_tokens stay right, the draft attends to zeros where its context "
        "should be and the accept length collapses. L1-only caches never load back; stateless proposers "
        "have no draft state."
    ),
)

MAMBA_WHOLE_BLOCK_OFFLOAD = Fault(
    name="mamba_whole_block_offload",
    incident="vLLM #50507 before the fix: hybrid offload restores Mamba state in whole blocks only (784 of 900)",
    triggers={"model": ("hybrid",), "cache": ("host", "storage")},
    oracle="cached_tokens",
    doc=(
        "Offloading a hybrid prefix keeps its Mamba snapshots only at whole 32-token blocks, so a prompt's "
        "tail snapshot (its last page × chunk grid point) is lost below L1 and a warm hit from L2 stops at the "
        "block before it. Dense models have no snapshots; cache=device never offloads."
    ),
)

FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        PRIORITY_SCHEDULER_DROP, UNIFIED_EXTEND_VIRTUAL_LOC, UNIFIED_NO_ZERO_ON_ISSUE, SLOT_STRIDE_INT32,
        DRAFT_STATE_NOT_CACHED, MTP_LAYER_INDEX_OOB, HICACHE_DRAFT_NOT_RESTORED, MAMBA_WHOLE_BLOCK_OFFLOAD,
    )
}


class UnknownFaultError(ValueError):
    """A fault name that is not in the registry."""


def check_faults(names: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Validate fault names; the error lists the known ones."""
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise UnknownFaultError(f"unknown fault {unknown[0]!r} (known: {', '.join(sorted(FAULTS))})")
    return frozenset(names)
