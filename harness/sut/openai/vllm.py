"""vLLM's api_server (``read_back = "vllm"``): what it applied, the rules its cells are judged by, and what its KV
connectors moved.

What was asked is read from the launch (vLLM's own flags, ``vllm/engine/arg_utils.py``), in the ``vllm.LLM``
argument names the offline engine uses, so a server cell is judged by the offline engine's rules
(``harness.sut.vllm_common``, shared with ``harness.sut.vllm``): the settings it applied compared by
``applied.read_back``, its prefix cache by ``cache.cache_rule`` on the block size it used, its proposer replayed by
``spec.replay_rule``. What it applied
is ``GET /server_info?config_format=json`` (a development endpoint: ``VLLM_SERVER_DEV_MODE=1``), the ``VllmConfig``
the engine runs with (num_gpu_blocks included: the engine core runs in the server's process).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

from harness.sut.base import Traits
from harness.sut.openai.launch import flag_value
from harness.sut.openai.wire import ServerError, samples
from harness.sut.vllm_common.applied import applied_traits, read_back
from harness.sut.vllm_common.cache import cache_rule
from harness.sut.vllm_common.metrics import CONNECTOR_COUNTERS, NIXL_BYTES, connector_counters
from harness.sut.vllm_common.spec import drops_eagle_block, replay_rule, whole_drafts

if TYPE_CHECKING:
    from harness.sut.openai.launch import Launch
    from harness.sut.openai.server import ServerProcess

SERVER_INFO = "/server_info?config_format=json"
#: vLLM's flags (``--name value`` or ``--name=value``) by the ``vllm.LLM`` argument each sets, and how its value reads.
VALUED = {"--block-size": ("block_size", int), "--kv-cache-dtype": ("kv_cache_dtype", str),
          "--max-num-seqs": ("max_num_seqs", int), "--max-num-batched-tokens": ("max_num_batched_tokens", int),
          "--max-model-len": ("max_model_len", int), "--num-gpu-blocks-override": ("num_gpu_blocks_override", int),
          "--speculative-config": ("speculative_config", json.loads)}
#: vLLM's boolean flags: (the argument, the value the flag sets).
SWITCHES = {"--enable-prefix-caching": ("enable_prefix_caching", True),
            "--no-enable-prefix-caching": ("enable_prefix_caching", False),
            "--async-scheduling": ("async_scheduling", True), "--no-async-scheduling": ("async_scheduling", False)}
#: the scheduler settings a replay needs, read from what vLLM applied when the launch leaves them to it.
SCHEDULED = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")


def asked(argv: Sequence[str]) -> dict[str, object]:
    """The ``vllm.LLM`` arguments the launch's flags set (the last of a repeated flag wins, as argparse has it)."""
    arguments: dict[str, object] = {}
    for i, arg in enumerate(argv):
        flag = arg.partition("=")[0]
        if flag in VALUED:
            name, read = VALUED[flag]
            arguments[name] = flag_value(argv, i, read)
        elif arg in SWITCHES:
            name, value = SWITCHES[arg]
            arguments[name] = value
    return arguments


def applied_config(config: Mapping) -> dict[str, object]:
    """What vLLM applied, from ``/server_info``'s ``vllm_config``, in the keys the offline child reports
    (``child.applied_config``)."""
    try:
        cache, scheduler, spec = config["cache_config"], config["scheduler_config"], config["speculative_config"]
        return {"async_scheduling": bool(scheduler["async_scheduling"]), "block_size": int(cache["block_size"]),
                "kv_cache_dtype": str(cache["cache_dtype"]), "enable_prefix_caching": bool(cache["enable_prefix_caching"]),
                "max_num_seqs": int(scheduler["max_num_seqs"]),
                "max_num_batched_tokens": int(scheduler["max_num_batched_tokens"]),
                "num_gpu_blocks": cache["num_gpu_blocks"], "max_model_len": int(config["model_config"]["max_model_len"]),
                "spec_method": None if spec is None else str(spec["method"]),
                "num_speculative_tokens": None if spec is None else int(spec["num_speculative_tokens"]),
                "drops_eagle_block": spec is not None and drops_eagle_block(spec)}
    except (KeyError, TypeError, ValueError) as exc:
        raise ServerError(f"malformed response to GET {SERVER_INFO}: vllm_config lacks {exc}") from None


def judged_traits(traits: Traits, levels: Mapping[str, object], argv: Sequence[str], config: Mapping) -> Traits:
    """``traits`` as vLLM's server applied them: the settings read back beside the launch's, its cache judged by vLLM's
    rule on the block size it used, its proposer replayed where vLLM's rule is known."""
    applied = applied_config(config)
    arguments = asked(argv)
    arguments.update({name: applied[name] for name in SCHEDULED if name not in arguments})
    pressed = "num_gpu_blocks_override" in arguments
    judging = {"cache": levels["cache"], "spec": levels["spec"], "kv_capacity": "tight" if pressed else "roomy",
               "pd": levels["pd"], "model": levels["model"]}
    rule = cache_rule(judging, bool(applied["drops_eagle_block"]))
    judged = applied_traits(traits, read_back(arguments, applied), judging)
    return replace(judged, cache=replace(judged.cache, rule=rule), pressed=pressed,
                   spec=replace(judged.spec, replay=replay_rule(levels, arguments),
                                whole_drafts=whole_drafts(arguments)))


def read_traits(process: ServerProcess, launch: Launch, traits: Traits, timeout_s: float) -> Traits:
    """``traits`` as a healthy vLLM server applied them (``judged_traits``), read from ``/server_info``."""
    info = process.call(SERVER_INFO, None, timeout_s, f"to GET {SERVER_INFO} (VLLM_SERVER_DEV_MODE=1 serves it)")
    if not isinstance(info, dict) or not isinstance(info.get("vllm_config"), dict):
        raise ServerError(f"malformed response to GET {SERVER_INFO}: no vllm_config object")
    return judged_traits(traits, launch.levels, launch.argv, info["vllm_config"])


def moved(metrics: str) -> dict[str, int]:
    """What vLLM's KV connectors moved so far, from its Prometheus exposition, in the offline child's keys
    (``metrics.connector_counters``): counters lose their ``_total``, NIXL's byte histogram keeps its sum and count."""
    wanted = {name for name, _ in CONNECTOR_COUNTERS.values()}
    records: list[SimpleNamespace] = []
    histograms: dict[str, SimpleNamespace] = {}
    for name, labels, value in samples(metrics):
        if name.removesuffix("_total") in wanted:
            records.append(SimpleNamespace(name=name.removesuffix("_total"), labels=labels, value=value))
        elif name in (f"{NIXL_BYTES}_sum", f"{NIXL_BYTES}_count"):
            key = json.dumps(labels, sort_keys=True)
            histogram = histograms.setdefault(key, SimpleNamespace(name=NIXL_BYTES, labels=labels, sum=0.0, count=0.0))
            setattr(histogram, name.rpartition("_")[2], value)
    return connector_counters([*records, *histograms.values()])
