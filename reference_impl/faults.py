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
    exception: str | None = None  # oracle "error": the exception type the crash must raise (its class name)

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
    triggers={"spec": ("draft", "mtp"), "cache": ("device", "host", "storage")},
    oracle="accept_length",
    doc=(
        "When a finished prompt's pages enter the prefix cache, the draft pool's K/V of those pages is "
        "dropped; a later hit restores the target's K/V (tokens and cached_tokens stay right) while the "
        "draft reads nothing where its context should be, so its proposals and the accept length collapse. "
        "The L1 radix cache is the same under cache=host and cache=storage (HiCache keeps a device tree too), "
        "so those hit the lost state as well. Stateless proposers (none, ngram) and cache=off never show it."
    ),
)

MTP_LAYER_INDEX_OOB = Fault(
    name="mtp_layer_index_oob",
    incident="vLLM #49642: the MTP layer's index (num_layers) used on a per-layer table of length num_layers",
    triggers={"spec": ("mtp",)},
    oracle="error",
    exception="IndexError",
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

NGRAM_PROMPT_ONLY = Fault(
    name="ngram_prompt_only",
    incident="class: a proposer's lookup table built once at admission (prompt n-grams only), never extended with output",
    triggers={"spec": ("ngram",)},
    oracle="accept_length",
    doc=(
        "Prompt lookup searches only n-grams that lie inside the prompt, so once the output repeats itself "
        "(the tiny dense model loops within 32 tokens) the proposer misses what a correct one drafts. Every "
        "token stays the target's; a golden run with the same bug agrees with the cell, so only the replay of "
        "prompt lookup over the request's own tokens sees it (seen on repeated_phrases, where every step drafts). "
        "Draft models and plain decoding do not look anything up."
    ),
)

TENANT_NAMESPACE_DROPPED = Fault(
    name="tenant_namespace_dropped",
    incident="vLLM #48069 (before it): the tenant id never reaches the shared store; deployments share one namespace",
    triggers={"cache": ("storage",)},
    oracle="cached_tokens",
    doc=(
        "Every engine writes and reads L3 under the default namespace whatever its tenant, so a second tenant "
        "serving the same prompts on the same store (file or Redis) hits the first one's pages. Seen on the "
        "isolation workload's second-tenant pass; L1 and L2 are per engine, so cache=device and host never show it."
    ),
)

PAGE_KEY_FORGETS_PREFIX = Fault(
    name="page_key_forgets_prefix",
    incident="class: a block key hashed from the block's own tokens, not chained onto its prefix (cf. vLLM block hashes)",
    triggers={"cache": ("host", "storage")},
    oracle="cached_tokens",
    doc=(
        "L2 and L3 key a page by its own tokens only, so the same page-aligned chunk after a different head has "
        "the same key: a request whose head is cached loads the chunk another head computed (wrong K/V, more "
        "cached tokens than any prefix it shares). Needs text where one chunk follows two heads (templated); L1's "
        "tree is keyed by path and cache=device never asks a key."
    ),
)

DRAFT_PAGES_KEPT_ON_PREEMPT = Fault(
    name="draft_pages_kept_on_preempt",
    incident="class: SGLang retract under speculative decoding frees the target KV but not the sidecar draft KV",
    triggers={"spec": ("draft",)},
    oracle="error",
    exception="PoolIntegrityError",
    doc=(
        "Preempting a request (recompute) gives its pages back to the target pool but leaves them live in the "
        "draft's own pool, whose pages must be issued in lockstep: the next time the target issues one of them the "
        "draft pool issues another and the engine stops with a PoolIntegrityError. Needs preemption while "
        "speculating (spec_preempt); spec=mtp keeps its K/V in the target pool, plain and ngram have no draft pool."
    ),
)

SPLIT_SNAPSHOT_TO_HEAD = Fault(
    name="split_snapshot_to_head",
    incident="class: SGLang MambaRadixCache node splits ('tombstones'): the Mamba value must stay with the node's end",
    triggers={"model": ("hybrid",), "cache": ("device", "host", "storage")},
    oracle="cached_tokens",
    doc=(
        "Splitting a cached node in the middle gives its snapshot to the new head, which ends before the snapshot's "
        "position: a later prompt that shares exactly the head resumes from a state that has seen tokens it has not "
        "(more cached tokens than any snapshot allows, wrong logprobs). Needs a divergence inside a multi-page node "
        "that carries a snapshot (snapshot_split); dense models have no snapshots, cache=off no tree."
    ),
)

SPEC_FINISH_PAGE_LEAK = Fault(
    name="spec_finish_page_leak",
    incident="class: SGLang 'KV cache pool leak detected' with speculative decoding: a request's last page not freed",
    triggers={"spec": ("ngram", "draft", "mtp")},
    oracle="pool_audit",
    doc=(
        "When a request that ran speculative decoding finishes, the page its last verify step wrote is dropped from "
        "its table but never freed: one page leaks per request, silently until the pool runs dry. Plain decoding "
        "frees it."
    ),
)

EVICT_IGNORES_LOCK = Fault(
    name="evict_ignores_lock",
    incident="class: SGLang's RadixCache.evict skips a leaf with lock_ref > 0; without that one check it frees a running request's prefix",
    triggers={"cache": ("device", "host", "storage")},
    oracle="error",
    exception="ValueError",
    doc=(
        "Eviction takes least-recently-used leaves without looking at their locks, so a prefix a running request "
        "still reads (its matched node, a leaf once its other children are evicted) is freed and re-issued to "
        "another request, which overwrites it; when the running request finishes, the tree is handed pages it "
        "already owns elsewhere and refuses them (ValueError). Needs a request that holds a matched prefix while a "
        "burst forces eviction around it (locked_prefix); cache=off has no tree."
    ),
)

EVICT_COUNTS_LEAVES = Fault(
    name="evict_counts_leaves",
    incident="class: an eviction loop that counts the leaves it removed, not their pages (cf. SGLang RadixCache.evict, "
             "num_evicted += len(x.value)), so it frees more than it was asked to",
    triggers={"cache": ("device", "host", "storage"), "model": ("dense",), "spec": ("none",)},
    oracle="cached_tokens",
    doc=(
        "Each evicted leaf counts as one page however many it held: asked for n pages, L1 frees n leaves, and "
        "prefixes a later request would have hit are gone (cache=device: a lost hit; host and storage: the hit "
        "comes back from L2, the total unchanged, the split not). Inside the band [0, best hit] of a capped "
        "pass; seen where the independent cache model gives the exact hit per tier (leaf_pressure, served one "
        "request at a time): a dense model without a proposer. Hybrid and speculative cells lose the same hit, "
        "inside the band they keep (Mamba snapshots and draft pages are not modelled). cache=off has no tree."
    ),
)

DRAFT_CHAIN_DEFAULT_STEPS = Fault(
    name="draft_chain_default_steps",
    incident="class: a draft model's chain sized by the default speculative step count (3), not by num_draft_tokens "
             "(cf. SGLang #34234: a draft pool sized by another proposer's assumption)",
    triggers={"spec": ("draft", "mtp"), "num_draft_tokens": (4, 5, 6, 7, 8)},
    oracle="accept_length",
    doc=(
        "The draft chain keeps each step's hidden in a ring of three slots, as a buffer sized for three "
        "speculative steps does: at k ≤ 3 it never wraps, at k ≥ 4 the fourth draft reads the first step's hidden "
        "again (it repeats the first draft) and is mostly rejected. Tokens stay the target's; accept length drops below the band measured "
        "at that k (bands existed at k = 3 only before issue 20). ngram drafts without a chain; k ≤ 3 is untouched. "
        "At k = 4 a hybrid model loses about 5% of its accept length, inside the band margin on some workloads: "
        "the spec matrix crosses k = 5, where every draft and MTP cell shows it."
    ),
)

HOST_DEMOTES_AS_OLDEST = Fault(
    name="host_demotes_as_oldest",
    incident="class: SGLang HiRadixCache write-through eviction: a node evicted from device must become the host "
             "pool's most recent copy, not its next victim",
    triggers={"cache": ("host", "storage")},
    oracle="cached_tokens",
    doc=(
        "When L1 evicts a page whose copy L2 holds (write-through), L2 marks that copy least recently used instead "
        "of most: the next L2 pressure drops the prefix L1 just gave up, before older copies nobody asked for. "
        "Needs L2 full after L1 evicted a shared head that is asked for again (demoted_head); with cache=storage "
        "L3 re-supplies the head (the total is unchanged, which is how it hid) but from the store instead of L2, "
        "which the exact per-tier split sees. cache=device has no L2."
    ),
)

FULL_HIT_LAST_TOKEN_ONLY = Fault(
    name="full_hit_last_token_only",
    incident="vLLM #11186 (before it): a fully cached prompt recomputed its last token alone, not its last block",
    triggers={"model": ("dense",), "cache": ("device", "host", "storage"), "page_size": (2, 4, 8, 16, 32, 64)},
    oracle="cached_tokens",
    doc=(
        "When every page of a prompt of an exact page multiple is cached (the same prompt again), the match takes the "
        "whole prompt and steps back one token, not one page: the request reports n - 1 cached tokens, a count no "
        "whole-page cache grants, and recomputes its last token into the cached last page (vLLM's allocate_slots "
        "counted whole blocks, so that block was not cached right and the hash chain broke; tokens stayed right). "
        "Only a full-prompt hit at k*B shows it: at k*B +- 1 the last token's page is not whole, at page size 1 a "
        "token is a page, a hybrid model resumes only at a snapshot (its match is left alone), cache=off never hits. "
        "No prompt of smoke's fixed workloads is a multiple of 16; the boundary family draws them (issue 42)."
    ),
)

PD = ("inproc", "nixl", "mooncake")

PD_STAGING_GRID_SHIFT = Fault(
    name="pd_staging_grid_shift",
    incident="SGLang #30545: PD staging locates chunks by start_page // full_chunk_pages, assuming an even grid from page 0",
    triggers={"pd": PD, "pd_staging": ("on",), "model": ("dense",), "cache": ("device", "host", "storage"),
              "prefill_budget": (16, 24, 32)},
    oracle="logprobs",
    doc=(
        "The prefill side writes grid cell g of a transfer into staging slot base + g, while the decode side "
        "reserved (and reads) slots from the cell of the first page it lacks: a decode-side prefix hit of a whole "
        "chunk or more shifts every chunk by that many slots, and the decode side scatters stale staging bytes "
        "into its pages. Needs staging, a decode-side hit (a dense model: a hybrid decode side keeps no Mamba "
        "snapshots, so it never hits) and chunks no longer than the workloads' shared heads (prefill_budget ≤ 32)."
    ),
)

PD_VIRTUAL_IDS_ON_WIRE = Fault(
    name="pd_virtual_ids_on_wire",
    incident="SGLang #33362: PD transfer addresses a unified pool's pages by virtual id",
    triggers={"pd": PD, "pool": ("unified",)},
    oracle="logprobs",
    doc=(
        "Neither handoff point translates: the prefill side reads its pages by virtual id when it sends a chunk, "
        "the decode side hands out virtual ids when it pops its preallocated pages. A static pool's ids are "
        "physical, so only the unified pool (where virtual v starts at physical size-1-v) moves the wrong bytes."
    ),
)

PD_COMPACTION_IN_FLIGHT = Fault(
    name="pd_compaction_in_flight",
    incident="SGLang #33362: a unified pool compacts (moves pages) while a PD transfer into them is in flight",
    triggers={"pd": PD, "pool": ("unified",), "page_size": (16,)},
    oracle="logprobs",
    doc=(
        "No move gate: the decode side's lazy compaction moves pages whose physical ids the prefill side already "
        "holds, and the chunks written after the move land in the vacated pages. The pd_churn workload makes the "
        "decode side free enough pages, while a long transfer waits, for its next decode step to compact; at "
        "page size 1 its short prompts stay cached and the frees never reach the lazy threshold."
    ),
)

PD_MAMBA_STATE_EARLY = Fault(
    name="pd_mamba_state_early",
    incident="SGLang #33362 / PD life cycle: the Mamba state must travel with the last chunk",
    triggers={"pd": PD, "model": ("hybrid",)},
    oracle="logprobs",
    doc=(
        "The prefill side sends the request's Mamba state with its first chunk, when the state has seen only that "
        "chunk's tokens; the decode side resumes from it. Needs a prompt that spans more than one chunk: every "
        "workload prompt does at prefill_budget ≤ 32, and split_kv (140 tokens) at every budget up to 128 (the "
        "trigger once named budgets 16 and 32 only, and smoke's hybrid PD cells at 128 failed outside it)."
    ),
)

PD_DRAFT_STATE_NOT_SENT = Fault(
    name="pd_draft_state_not_sent",
    incident="SGLang #30393 (PD form): the proposer's KV is left behind when a request moves to decode",
    triggers={"pd": PD, "spec": ("draft", "mtp")},
    oracle="accept_length",
    doc=(
        "The transfer carries the target's KV but not the draft's (the draft pool's pages for spec=draft, the MTP "
        "tail layer for spec=mtp, cut off the end of a unified envelope): the decode side drafts from zeros, the "
        "accept length collapses while every token stays the target's. Stateless proposers have nothing to leave."
    ),
)

PD_PREFILL_VERIFY_SCRATCH = Fault(
    name="pd_prefill_verify_scratch",
    incident="SGLang #34191 (before it): the PD prefill server allocates speculative-verify scratch it never uses",
    triggers={"pd": PD, "spec": ("ngram", "draft", "mtp"), "model": ("hybrid",)},
    oracle="pd_audit",
    doc=(
        "The prefill engine builds the per-draft-token Mamba state snapshots of verify steps as if it verified "
        "(num_draft_tokens + 1 states per running request, every Mamba layer: ~24 GB a rank in the incident), "
        "though a prefill server never runs TARGET_VERIFY. No token changes; only the ledger's verify scratch "
        "shows it. Needs PD (a plain engine verifies and must have it), a proposer (no verify steps without one) "
        "and a hybrid model (dense verify steps need no Mamba snapshots)."
    ),
)

PD_ABORT_CACHES_PAGES = Fault(
    name="pd_abort_caches_pages",
    incident="SGLang #30233 / PD life cycle: an aborted transfer's pages must go back unread, never into the radix cache",
    triggers={"pd": PD, "pd_fail_rate": (0.1, 0.2, 0.3), "cache": ("device", "host", "storage")},
    oracle="pd_audit",
    doc=(
        "The decode side handles a failed transfer as if its last chunk had landed: it inserts the prompt's "
        "preallocated pages, half of them never written, into its radix cache, where the retry (and any request "
        "sharing the prefix) may hit them. Needs PD, lost chunks (pd_fail_rate > 0: no abort otherwise) and a "
        "cache (cache=off adopts nothing and frees the pages). The pd matrix never set pd_fail_rate before issue 20."
    ),
)

PD_PARTIAL_PAGE_EARLY = Fault(
    name="pd_partial_page_early",
    incident="SGLang #33362 / PD life cycle: only whole pages leave before the last chunk (the partial page waits)",
    triggers={"pd": PD, "deterministic": ("off",), "page_size": (2, 4, 8, 16, 32, 64)},
    oracle="logprobs",
    doc=(
        "The sender rounds a request's computed tokens up to pages, not down: a chunk that ends inside a page sends "
        "that page half written and counts it as sent, so the tokens the next chunk computes into it never reach "
        "the decode side, which attends to unwritten slots. Needs PD and a chunk that ends off the page grid: with "
        "deterministic off, a prefill budget that is not a multiple of the page (24 at page 16), or any budget a "
        "step shares among several requests; deterministic prefill cuts on the 16-token grid, so at page 16 every "
        "chunk end is a page end, and at page 1 every page is whole. The pd matrix ran deterministic only."
    ),
)

FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        PRIORITY_SCHEDULER_DROP, UNIFIED_EXTEND_VIRTUAL_LOC, UNIFIED_NO_ZERO_ON_ISSUE, SLOT_STRIDE_INT32,
        DRAFT_STATE_NOT_CACHED, MTP_LAYER_INDEX_OOB, HICACHE_DRAFT_NOT_RESTORED, MAMBA_WHOLE_BLOCK_OFFLOAD,
        NGRAM_PROMPT_ONLY, TENANT_NAMESPACE_DROPPED, PAGE_KEY_FORGETS_PREFIX, DRAFT_PAGES_KEPT_ON_PREEMPT,
        SPLIT_SNAPSHOT_TO_HEAD, SPEC_FINISH_PAGE_LEAK, EVICT_IGNORES_LOCK, HOST_DEMOTES_AS_OLDEST,
        DRAFT_CHAIN_DEFAULT_STEPS, EVICT_COUNTS_LEAVES, FULL_HIT_LAST_TOKEN_ONLY,
        PD_STAGING_GRID_SHIFT, PD_VIRTUAL_IDS_ON_WIRE, PD_COMPACTION_IN_FLIGHT, PD_MAMBA_STATE_EARLY,
        PD_DRAFT_STATE_NOT_SENT, PD_PREFILL_VERIFY_SCRATCH, PD_ABORT_CACHES_PAGES,
        PD_PARTIAL_PAGE_EARLY,
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
