"""vLLM's KV connectors as a cell's levels make them: the tier below the prefix cache (``cache``) and the PD handoff
(``pd``), each a ``kv_transfer_config``. The rules of what each moves, from vLLM's own source, are
``harness.sut.vllm_common.cache``'s (shared with the api_server's path).

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
from pathlib import Path


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
#: seconds a NIXL prefill side keeps a finished request's blocks for the decode side (``kv_lease_duration``; vLLM's
#: default 30 s). The harness hands a round over once the prefill side has answered all of it: a round that takes
#: longer to prefill than the lease (a 16-token step budget, a drafter, a loaded host) let the first requests' leases
#: run out, and the decode side read blocks freed since (``findings/vllm-pd-expired-lease-read``). A proxy that forwards
#: each request at once, as vLLM's toy proxy does, reaches the decode side well inside vLLM's default.
LEASE_S = 900
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
        config["kv_connector_extra_config"] = {"kv_lease_duration": LEASE_S}
    if tier is None or role != "kv_producer":
        return config
    return {"kv_connector": "MultiConnector", "kv_role": role,
            "kv_connector_extra_config": {"connectors": [config, dict(tier)]}}
