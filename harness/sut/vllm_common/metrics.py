"""What vLLM's KV connectors moved, as its metrics name it: read alike from the offline engine's ``LLM.get_metrics()``
(the child) and the api_server's Prometheus exposition. Standard library only: vLLM's interpreter loads it by its path
(``harness.sut.vllm.child``), and a reproducer script copies it in."""
from __future__ import annotations


#: what a KV connector moved, by the key the answer gives it: prometheus counters (name, label to match), and the
#: sum and count of NIXL's per-transfer byte histogram.
CONNECTOR_COUNTERS = {
    "local_compute": ("vllm:prompt_tokens_by_source", "local_compute"),
    "local_cache_hit": ("vllm:prompt_tokens_by_source", "local_cache_hit"),
    "external_kv_transfer": ("vllm:prompt_tokens_by_source", "external_kv_transfer"),
    "prompt_tokens": ("vllm:prompt_tokens", None),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", None),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries", None),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits", None),
    "nixl_failed_transfers": ("vllm:nixl_num_failed_transfers", None),
    # the prefill side's: requests whose leased blocks it released unread, and decode-side reads it heard of after
    "nixl_expired_leases": ("vllm:nixl_num_kv_expired_reqs", None),
    "nixl_reads_after_expiry": ("vllm:nixl_num_notifications_after_expiry", None),
}
NIXL_BYTES = "vllm:nixl_bytes_transferred"


def connector_counters(metrics: list) -> dict:
    """What KV connectors moved so far (``CONNECTOR_COUNTERS``, and NIXL's bytes and transfers), summed over engines."""
    out = dict.fromkeys([*CONNECTOR_COUNTERS, "nixl_bytes", "nixl_transfers"], 0)
    for metric in metrics:
        for key, (name, source) in CONNECTOR_COUNTERS.items():
            if metric.name == name and (source is None or metric.labels.get("source") == source):
                out[key] += int(metric.value)
        if metric.name == NIXL_BYTES:
            out["nixl_bytes"] += int(metric.sum)
            out["nixl_transfers"] += int(metric.count)
    return out
