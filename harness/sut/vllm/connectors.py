"""vLLM's KV connectors as a cell's levels make them: the tier below the prefix cache (``cache``) and the PD handoff
(``pd``), each a ``kv_transfer_config``; and the rules of what each moves, from vLLM's own source.

======================  ================================================================================
cache = storage         ``ExampleConnector`` (``kv_both``) over a directory of the cell's own: the disk tier
cache = offload         ``OffloadingConnector`` (CPU memory behind a GPU's KV; CUDA and XPU only)
cache = cpu_offload     ``SimpleCPUOffloadConnector`` (CUDA only)
cache = lmcache         ``LMCacheConnectorV1`` (``lmcache`` installs only with CUDA wheels)
pd = nixl               ``NixlConnector``: a ``kv_producer`` prefill engine and a ``kv_consumer`` decode engine,
                        KV buffers in CPU memory, UCX over loopback
pd = mooncake           ``MooncakeConnector`` (needs an accelerator device)
pd × a tier             the prefill engine's PD connector and the tier under ``MultiConnector``; the decode
                        engine has its PD connector alone
======================  ================================================================================
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from fixtures.workloads import CachedExpectation, Workload, best_hit
from harness.sut.base import PassResult, Traits
from harness.sut.rules import SHARED

#: the tier levels of ``cache`` and the connector each names (``device`` and ``off`` have none).
TIER_CONNECTORS: Mapping[str, str] = {
    "storage": "ExampleConnector",
    "offload": "OffloadingConnector",
    "cpu_offload": "SimpleCPUOffloadConnector",
    "lmcache": "LMCacheConnectorV1",
}
#: the PD levels of ``pd`` and the connector each names.
PD_CONNECTORS: Mapping[str, str] = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector"}
#: CPU memory the offloading connectors are given (the KV cache itself is 256 MiB: child.py's DEFAULT_ARGS).
OFFLOAD_BYTES = 256 << 20

#: what vLLM's toy proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``) sends the prefill
#: engine with ``max_tokens = 1``: the decode side will read this request's KV, so keep its blocks until it has.
PREFILL_PARAMS: Mapping[str, object] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
    "remote_host": None, "remote_port": None,
}
#: the tokens the prefill side's ``max_tokens`` asks: one, which the decode side never shows (its own first token is
#: computed again on the decode side, and on the hybrid model is not the decode side's).
PREFILL_TOKENS = 1
#: the environment each engine of a NIXL pair gets: UCX over loopback only (the box has no other device it may use).
NIXL_ENV: Mapping[str, str] = {"UCX_NET_DEVICES": "lo"}
#: the variable that gives each engine of a pair its own NIXL side-channel port (the handshake's listener).
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
PD_ROLES = ("kv_producer", "kv_consumer")


def tier_config(level: str, directory: Path | None) -> dict | None:
    """``kv_transfer_config`` for a ``cache`` level with a tier (None for ``off`` and ``device``); ``directory`` is
    the storage tier's, a directory of the cell's own."""
    connector = TIER_CONNECTORS.get(level)
    if connector is None:
        return None
    config: dict = {"kv_connector": connector, "kv_role": "kv_both"}
    if level == "storage":
        if directory is None:
            raise ValueError("cache = storage needs a directory for its tier")
        config["kv_connector_extra_config"] = {"shared_storage_path": str(directory)}
    elif level == "offload":
        config["kv_connector_extra_config"] = {"cpu_bytes_to_use": OFFLOAD_BYTES}
    return config


def pd_config(level: str, role: str, tier: Mapping | None = None) -> dict:
    """``kv_transfer_config`` for one engine (``role``: ``kv_producer`` or ``kv_consumer``) of a PD pair; ``tier`` (a
    ``tier_config``) puts a tier beside the producer's PD connector, both under vLLM's ``MultiConnector``: the prefill
    side's prefix cache then has a tier below it, as a production prefill fleet's does."""
    if role not in PD_ROLES:
        raise ValueError(f"a PD engine is a kv_producer or a kv_consumer, not {role!r}")
    config: dict = {"kv_connector": PD_CONNECTORS[level], "kv_role": role}
    if level == "nixl":
        config["kv_buffer_device"] = "cpu"  # UCX over DRAM: what a CPU-only box has
    if tier is None or role != "kv_producer":
        return config
    return {"kv_connector": "MultiConnector", "kv_role": role,
            "kv_connector_extra_config": {"connectors": [config, dict(tier)]}}


# -- what each connector moves, by vLLM's source ---------------------------------------------------------------
def example_tier_hit(prompt_tokens: int, block_size: int) -> int:
    """Tokens ``ExampleConnector`` loads for a prompt whose key is in its directory: it keys a whole prompt by the
    hash of ``align_to_block_size(len(prompt) - 1)`` tokens, ``(n - 1) // block * block`` of ``n = len - 1``
    (``example_connector.py``: ``get_num_new_matched_tokens``, ``align_to_block_size``), so one block less than the
    prefix cache whenever ``len - 1`` is a multiple of the block; a prompt sharing fewer tokens hits nothing."""
    return max(prompt_tokens - 2, 0) // block_size * block_size


def nixl_backoff(hybrid: bool) -> int:
    """Prompt tokens the decode side computes itself instead of reading them: none on an attention model, one on a
    Mamba hybrid, whose decoder needs the state h(N - 1) (``nixl/base_scheduler.py``, ``_prefill_backoff`` and
    ``_truncate_request_for_prefill``: the prefill side stops that many tokens short)."""
    return 1 if hybrid else 0


@dataclass(frozen=True, slots=True)
class ExampleConnectorTier:
    """How a ``cache = storage`` cell's hits are granted (its ``CacheTraits.rule``): the cold pass starts from an empty
    tier and follows the shared page rule, the tier's share left free (a later round may load a key an earlier one
    stored, and vLLM reports no per-request split); every later pass follows a device-cache reset, so each request
    loads at least its own prompt's key from the tier (``example_tier_hit``), and at most that or what the pass's
    other prompts share with it in whole blocks (the device cache, refilled within the pass). No host tier: its
    share is 0."""

    name: str = ("ExampleConnector's disk tier: a whole prompt keyed by its block-aligned length - 1 "
                 "(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py), the device cache above it")

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """rid → the cached tokens allowed in pass ``name``."""
        pages = SHARED.expected(workload, traits, name, passes)
        if traits.pressed and name == "cold":  # a preempted request is recomputed: it may load its own saved key
            own = {r.rid: example_tier_hit(len(r.prompt), pages[r.rid].page_size) for r in workload.requests}
            return {rid: replace(e, hi=max(e.hi, own[rid]), host=0, storage=None, basis=self.name)
                    for rid, e in pages.items()}
        if name == "cold" or traits.aborts_allowed or not traits.cache.enabled:
            return {rid: replace(e, host=0, storage=None, basis=self.name) for rid, e in pages.items()}
        expected = {}
        for request in workload.requests:
            page = pages[request.rid]
            tier = example_tier_hit(len(request.prompt), page.page_size)
            others = [r.prompt for r in workload.requests if r is not request]
            device = best_hit(request.prompt, others, page_size=page.page_size, state_interval=page.page_size,
                              hybrid=False)
            expected[request.rid] = CachedExpectation(tier, max(tier, device), page.page_size, host=0, storage=None,
                                                      basis=self.name)
        return expected
