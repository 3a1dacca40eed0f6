"""vLLM under test: its offline API in a child process of vLLM's own interpreter, one child per cell (a PD cell: a
pair, ``pd``).

The harness process never imports vllm: ``child.py`` runs under ``.venv-vllm`` (``make vllm-env``;
``$KVMATRIX_VLLM_PYTHON`` names another interpreter, a GPU runner's CUDA vllm say) and answers
line-delimited JSON (``protocol``). A child that dies, hangs past the cell's timeout or answers what the protocol
does not allow is stopped with its whole process group (``harness.sut.process``) and the cell becomes an ``error``
row carrying the child's stderr tail; nothing outlives the cell, Ctrl-C and a killed harness included. What each
factor maps to: ``arguments`` and ``connectors``.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fixtures.workloads import Workload
from harness.sut.base import CacheTraits, PassResult, SpecTraits, Totals, Traits
from harness.sut.inputs import InputsCheck
from harness.sut.vllm import LEVELS
from harness.sut.vllm.arguments import engine_arguments, prefill_arguments, round_size, tight_blocks
from harness.sut.vllm.pd import PdPair, PdSystem
from harness.sut.vllm.protocol import (
    INSIDE_COUNTERS, SCHEDULER_COUNTERS, SPEC_COUNTERS, ChildProcess, add_counters, add_inputs, audit_problems, field,
    request_output, serve_message, start_message,
)
from harness.sut.vllm_common.applied import applied_traits, read_back
from harness.sut.vllm_common.cache import cache_rule, nixl_backoff
from harness.sut.vllm_common.spec import replay_rule, replays_hits, whole_drafts
from reference_impl.request import RequestSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def vllm_traits(levels: Mapping[str, object], arguments: Mapping[str, object] | None = None) -> Traits:
    """What the oracles know of a vLLM cell, from its full levels and the ``vllm.LLM`` arguments they became
    (``engine_arguments``; without them, no proposer's rule to replay)."""
    page_size, cache = int(levels["page_size"]), str(levels["cache"])
    return Traits(
        dtype=DTYPES[str(levels["dtype"])], model=f"vllm-{levels['model']}",
        hybrid=levels["model"] == "hybrid", deterministic=levels["deterministic"] == "on",
        spec=SpecTraits(method=str(levels["spec"]), k=int(levels["num_draft_tokens"]), pass_counted=True,
                        replay_hits=replays_hits(str(levels["spec"]), levels.get("eagle_block_drop", "on") == "on"),
                        replay=replay_rule(levels, arguments) if arguments is not None else None,
                        whole_drafts=whole_drafts(arguments) if arguments is not None else True),
        # vLLM keeps a Mamba state at every block boundary (mamba_cache_mode "align"): the snapshot grid is the block
        cache=CacheTraits(enabled=cache != "off", page_size=page_size, chunk_size=page_size, state_interval=page_size,
                          tiers=("storage",) if cache == "storage" else (),
                          rule=cache_rule(levels)),
        audited=levels["audit"] == "on", pd=levels["pd"] != "off", pressed=levels["kv_capacity"] == "tight",
    )


class VllmEngine:
    """vLLM for one cell: one child (a PD cell: a pair of them), started at the first workload, its prefix cache and
    tier emptied for each next one. A storage tier lives in a directory of the cell's own, removed with it."""

    def __init__(self, levels: Mapping[str, object], faults: frozenset[str], device: str,
                 engine_args: Mapping[str, object]) -> None:
        if faults:
            raise ValueError(f"faults are planted in the reference engine; a vllm cell takes none ({', '.join(faults)})")
        self.levels = LEVELS.full(levels)
        self.tier = Path(tempfile.mkdtemp(prefix="kvmatrix-tier-")) if self.levels["cache"] == "storage" else None
        self.engine_args = engine_args
        self.arguments = engine_arguments(self.levels, engine_args, self.tier)
        self.env = {"VLLM_BATCH_INVARIANT": "1"} if self.levels["deterministic"] == "on" else {}
        if device.startswith("cuda"):
            self.env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2] or "0"
        self.traits = vllm_traits(self.levels, self.arguments)
        self.children: dict[bool, ChildProcess] = {}  # alone → its child
        self.blocks: dict[bool, int | None] = {}  # alone → the KV blocks its child was started with (None: roomy)
        self.pair: PdPair | None = None
        self.pair_blocks: tuple[int, int] | None = None  # the pair's KV blocks, decode and prefill side (None: roomy)

    def child(self, alone: bool, workload: Workload) -> tuple[ChildProcess, float]:
        """The cell's child (``alone``: a second one running one request at a time, with no tier), started on first
        use, and the seconds vLLM took to start it now (0 when it was running already, emptied for a new workload).
        A tight cell sizes its KV cache from ``workload``: a child of another size is replaced."""
        blocks = tight_blocks(workload, self.levels) if self.levels["kv_capacity"] == "tight" else None
        if alone in self.children and self.blocks[alone] == blocks:
            self.children[alone].ask({"op": "reset", "reset_connector": True})
            self.empty_tier()
            return self.children[alone], 0.0
        if alone in self.children:
            self.children.pop(alone).close()
            self.empty_tier()
        arguments = engine_arguments(self.levels, self.engine_args, self.tier, blocks)
        if alone:
            arguments = {**arguments, "max_num_seqs": 1}
            arguments.pop("kv_transfer_config", None)
        child = self.children[alone] = ChildProcess(self.env)
        self.blocks[alone] = blocks
        answer = child.ask(start_message(arguments, self.levels))
        if not alone:  # the cell's own engine: judged by what it applied (the one-at-a-time child runs 1 on purpose)
            self.read_back(arguments, answer)
        return child, float(field(answer, "seconds", (int, float)))

    def read_back(self, arguments: Mapping[str, object], answer: Mapping[str, object]) -> None:
        """Judge the cell by what its engine applied of ``arguments``, as its start ``answer`` says (what the child
        raised to vLLM's own least counted as asked): the block size vLLM used sets the cache's expectations."""
        asked = {**arguments, **answer.get("resized", {})}
        self.traits = applied_traits(self.traits, read_back(asked, field(answer, "applied", dict)), self.levels)

    def pd_pair(self, workload: Workload) -> tuple[PdPair, float, bool]:
        """The cell's PD pair, started side by side on first use (and the wall seconds that took), else emptied; and
        whether its caches are empty. A tight cell sizes the decode side's KV cache from ``workload``
        (``tight_blocks``) and the prefill side's to hold a round of it (``prefill_blocks``: each request's blocks
        stay there, leased, until the decode side has read them); a pair of another size is replaced."""
        tight = self.levels["kv_capacity"] == "tight"
        decode = tight_blocks(workload, self.levels) if tight else None
        prefill = prefill_arguments(workload, self.levels)
        blocks = (decode, prefill.get("num_gpu_blocks_override")) if tight else None
        if self.pair is not None and self.pair_blocks == blocks:
            emptied = self.pair.reset()
            self.empty_tier()
            return self.pair, 0.0, emptied
        if self.pair is not None:
            self.pair.close()
            self.pair = None
            self.empty_tier()
        arguments = engine_arguments(self.levels, self.engine_args, self.tier, decode)
        self.pair = PdPair(str(self.levels["pd"]), arguments, self.env, nixl_backoff(self.traits.hybrid), self.levels,
                           prefill=prefill, hold=round_size(workload) if tight else 1)
        self.pair_blocks = blocks
        # the decode side's cache is the one the warm pass hits (both sides apply the same arguments alike)
        self.read_back(arguments, self.pair.started["decode"])
        return self.pair, self.pair.start_seconds, True

    def empty_tier(self) -> None:
        """Empty the storage tier: ``reset_prefix_cache(reset_connector=True)`` leaves ExampleConnector's files
        (it has no ``reset_cache``), so a next workload's cold pass needs its directory emptied."""
        if self.tier is not None:
            for entry in self.tier.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def session(self, workload: Workload) -> VllmSession:
        return VllmSession(self, workload)

    def close(self) -> None:
        try:
            for child in self.children.values():
                child.close()
            if self.pair is not None:
                self.pair.close()
        finally:
            self.children.clear()
            self.pair = None
            if self.tier is not None:
                shutil.rmtree(self.tier, ignore_errors=True)


class VllmSession:
    """One workload's systems on the cell's child (or pair): a cold prefix cache and an empty tier at the first
    ``open``."""

    def __init__(self, engine: VllmEngine, workload: Workload) -> None:
        self.engine = engine
        self.workload = workload

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> VllmSystem | PdSystem:
        if tenant_suffix:
            raise ValueError("vLLM cells have no shared store: no second tenant to open")
        if self.engine.traits.pd and not alone:
            pair, start_seconds, emptied = self.engine.pd_pair(self.workload)
            return PdSystem(pair, self.engine.traits, start_seconds, emptied)
        child, start_seconds = self.engine.child(alone, self.workload)
        return VllmSystem(child, self.engine.traits, start_seconds, tiered=self.engine.tier is not None and not alone)

    def close(self) -> None:
        pass


class VllmSystem:
    """The child's engine behind the system-under-test protocol; closing leaves the child to the cell. A tiered
    system (``cache = storage``) empties its device cache before every pass after the first, which must then load
    from the tier."""

    def __init__(self, child: ChildProcess, traits: Traits, start_seconds: float, tiered: bool = False) -> None:
        self.child = child
        self.traits = traits
        self.tiered = tiered
        self.passes = 0
        self.seconds = {"start": start_seconds, "requests": 0.0}
        self.counted: dict[str, int] = {}  # the scheduler's counters over every pass

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        if self.tiered and self.passes:
            self.child.ask({"op": "reset", "reset_connector": False})
        self.passes += 1
        outputs, counters, problems = [], dict.fromkeys(SPEC_COUNTERS, 0), []
        untouched: dict[str, InputsCheck] = {}
        for group in rounds:
            answer = self.child.ask(serve_message(group))
            outputs += [request_output(out) for out in field(answer, "outputs", list)]
            add_inputs(untouched, answer)
            self.seconds["requests"] += float(field(answer, "seconds", (int, float)))
            add_counters(counters, answer, "tier_" if self.tiered else None)
            problems += audit_problems(answer)
        for name in (*SCHEDULER_COUNTERS, *INSIDE_COUNTERS):
            if name in counters:
                self.counted[name] = self.counted.get(name, 0) + counters[name]
        return PassResult(outputs=outputs, counters=counters, audit=problems, inputs=list(untouched.values()))

    def totals(self) -> Totals:
        return Totals(stats={name: self.counted[name] for name in (*SCHEDULER_COUNTERS, *INSIDE_COUNTERS)
                             if name in self.counted}, seconds=dict(self.seconds))

    def close(self) -> None:
        pass
