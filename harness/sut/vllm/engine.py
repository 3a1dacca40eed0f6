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
from harness.sut.vllm import LEVELS
from harness.sut.vllm.arguments import engine_arguments, lookup_rule
from harness.sut.vllm.connectors import ExampleConnectorTier, nixl_backoff
from harness.sut.vllm.pd import PdPair, PdSystem
from harness.sut.vllm.protocol import SPEC_COUNTERS, ChildProcess, add_counters, field, request_output, serve_message
from reference_impl.request import RequestSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def vllm_traits(levels: Mapping[str, object], arguments: Mapping[str, object] | None = None) -> Traits:
    """What the oracles know of a vLLM cell, from its full levels and the ``vllm.LLM`` arguments they became
    (``engine_arguments``; without them, no n-gram rule to replay)."""
    page_size, cache = int(levels["page_size"]), str(levels["cache"])
    return Traits(
        dtype=DTYPES[str(levels["dtype"])], model=f"vllm-{levels['model']}",
        hybrid=levels["model"] == "hybrid", deterministic=levels["deterministic"] == "on",
        spec=SpecTraits(method=str(levels["spec"]), k=int(levels["num_draft_tokens"]), pass_counted=True,
                        lookup=lookup_rule(arguments) if arguments is not None else None),
        # vLLM keeps a Mamba state at every block boundary (mamba_cache_mode "align"): the snapshot grid is the block
        cache=CacheTraits(enabled=cache != "off", page_size=page_size, chunk_size=page_size, state_interval=page_size,
                          tiers=("storage",) if cache == "storage" else (),
                          rule=ExampleConnectorTier() if cache == "storage" else None),
        audited=False, pd=levels["pd"] != "off",
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
        self.arguments = engine_arguments(self.levels, engine_args, self.tier)
        self.env = {"VLLM_BATCH_INVARIANT": "1"} if self.levels["deterministic"] == "on" else {}
        if device.startswith("cuda"):
            self.env["CUDA_VISIBLE_DEVICES"] = device.partition(":")[2] or "0"
        self.traits = vllm_traits(self.levels, self.arguments)
        self.children: dict[bool, ChildProcess] = {}  # alone → its child
        self.pair: PdPair | None = None

    def child(self, alone: bool) -> tuple[ChildProcess, float]:
        """The cell's child (``alone``: a second one running one request at a time, with no tier), started on first
        use, and the seconds vLLM took to start it now (0 when it was running already, emptied for a new workload)."""
        if alone in self.children:
            self.children[alone].ask({"op": "reset", "reset_connector": True})
            self.empty_tier()
            return self.children[alone], 0.0
        arguments = {**self.arguments, "max_num_seqs": 1} if alone else self.arguments
        if alone:
            arguments.pop("kv_transfer_config", None)
        child = self.children[alone] = ChildProcess(self.env)
        return child, float(field(child.ask({"op": "start", "engine_args": arguments}), "seconds", (int, float)))

    def pd_pair(self) -> tuple[PdPair, float, bool]:
        """The cell's PD pair, started side by side on first use (and the wall seconds that took), else emptied; and
        whether its caches are empty."""
        if self.pair is not None:
            emptied = self.pair.reset()
            self.empty_tier()
            return self.pair, 0.0, emptied
        self.pair = PdPair(str(self.levels["pd"]), self.arguments, self.env, nixl_backoff(self.traits.hybrid))
        return self.pair, self.pair.start_seconds, True

    def empty_tier(self) -> None:
        """Empty the storage tier: ``reset_prefix_cache(reset_connector=True)`` leaves ExampleConnector's files
        (it has no ``reset_cache``), so a next workload's cold pass needs its directory emptied."""
        if self.tier is not None:
            for entry in self.tier.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def session(self, workload: Workload) -> VllmSession:
        return VllmSession(self)

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

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> VllmSystem | PdSystem:
        if tenant_suffix:
            raise ValueError("vLLM cells have no shared store: no second tenant to open")
        if self.engine.traits.pd and not alone:
            pair, start_seconds, emptied = self.engine.pd_pair()
            return PdSystem(pair, self.engine.traits, start_seconds, emptied)
        child, start_seconds = self.engine.child(alone)
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

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        if self.tiered and self.passes:
            self.child.ask({"op": "reset", "reset_connector": False})
        self.passes += 1
        outputs, counters = [], dict.fromkeys(SPEC_COUNTERS, 0)
        for group in rounds:
            answer = self.child.ask(serve_message(group))
            outputs += [request_output(out) for out in field(answer, "outputs", list)]
            self.seconds["requests"] += float(field(answer, "seconds", (int, float)))
            add_counters(counters, answer, "tier_" if self.tiered else None)
        return PassResult(outputs=outputs, counters=counters)

    def totals(self) -> Totals:
        return Totals(stats={}, seconds=dict(self.seconds))

    def close(self) -> None:
        pass
