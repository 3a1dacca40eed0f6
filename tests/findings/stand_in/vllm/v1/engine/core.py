"""The stand-in's engine core: ``get_kv_cache_configs``, which a script's ``hold_requests`` wraps before ``LLM`` is
built; the stand-in ``LLM`` never calls it."""
from __future__ import annotations


def get_kv_cache_configs(vllm_config: object, kv_cache_specs: list, available_memory: list) -> list:
    raise AssertionError("the stand-in LLM sizes no KV cache")
