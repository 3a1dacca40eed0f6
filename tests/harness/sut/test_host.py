"""The host a run records (harness/sut/host.py): the CPU flags a declaration may need, the CPU model, the GPU, from
recorded /proc/cpuinfo texts of both kinds (tests/data/hosts: an Intel Xeon with AMX, an AMD EPYC with AVX-512 and no
AMX, an Arm Neoverse), so both branches run on either host; which facts two hosts differ in is
tests/harness/results/test_hosts.py's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.sut import host
from harness.sut.host import (KERNEL_FLAGS, Gpu, cpu_flags, cpu_model_of, cuda_of_smi, flags_of, gpu, gpu_of_smi,
                              kernel_flags, kernel_flags_of, record)

DATA = Path(__file__).resolve().parents[2] / "data" / "hosts"
X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 xsave\n\nprocessor\t: 1\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve crc32\n"


def cpuinfo(name: str) -> str:
    return (DATA / f"cpuinfo_{name}.txt").read_text()


def test_the_first_cpus_flags_are_read_on_x86_and_arm() -> None:
    assert flags_of(X86) == {"fpu", "sse4_2", "avx2", "avx512f", "avx512_bf16", "xsave"}
    assert flags_of(ARM) == {"fp", "asimd", "sve", "crc32"}
    assert flags_of("processor\t: 0\n") == frozenset()


def test_a_run_records_the_kernel_flags_this_cpu_has_in_their_order() -> None:
    got = kernel_flags()
    assert set(got) <= cpu_flags() and set(got) == cpu_flags() & set(KERNEL_FLAGS)
    assert got == sorted(got, key=KERNEL_FLAGS.index)


def test_a_xeon_with_amx_and_an_epyc_without_are_told_apart() -> None:
    xeon, epyc = kernel_flags_of(flags_of(cpuinfo("xeon_amx"))), kernel_flags_of(flags_of(cpuinfo("epyc")))
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16", "avx512f"} <= set(xeon)
    assert "avx512f" in epyc and "avx512_bf16" in epyc and not {"amx_tile", "amx_int8", "avx512_fp16"} & set(epyc)


def test_the_cpu_model_is_x86s_model_name_and_arms_implementer_and_part() -> None:
    assert cpu_model_of(cpuinfo("xeon_amx")) == "Intel(R) Xeon(R) Processor"
    assert cpu_model_of(cpuinfo("epyc")) == "AMD EPYC 9B14"
    assert cpu_model_of(cpuinfo("neoverse_v2")) == "ARM Neoverse-V2"
    assert cpu_model_of("CPU implementer\t: 0x41\nCPU part\t: 0xfff\n") == "ARM part 0xfff"
    assert cpu_model_of(X86) == "" and kernel_flags_of(flags_of(cpuinfo("neoverse_v2"))) == ["asimd", "sve"]


def test_nvidia_smis_answers_are_read() -> None:
    csv = "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA H100 80GB HBM3, 9.0, 550.54.15\n"
    assert gpu_of_smi(csv) == Gpu("NVIDIA H100 80GB HBM3", "9.0", "550.54.15")
    assert gpu_of_smi(csv, 2) is None and gpu_of_smi("") is None
    assert cuda_of_smi("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |") == "12.4"
    assert cuda_of_smi("no banner") is None


def test_the_gpu_comes_from_nvidia_smi_where_torch_sees_none(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"): "NVIDIA L4, 8.9, 535.1\n",
               (): "Driver Version: 535.1   CUDA Version: 12.2"}
    monkeypatch.setattr(host, "_smi", lambda *args: answers.get(args, ""))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu() == Gpu("NVIDIA L4", "8.9", "535.1", "12.2")
    monkeypatch.setattr(host, "_smi", lambda *args: "")
    assert gpu() is None


def test_the_gpu_torch_sees_is_named_by_torch_with_the_driver_nvidia_smi_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "_smi", lambda *args: "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\n" if args else "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert gpu() == Gpu("NVIDIA H100 80GB HBM3", "9.0", "550.54.15", "12.4")
    assert record("cuda:0").gpu == gpu() and gpu(1) is None  # GPU 1: neither torch nor nvidia-smi has one


def test_this_hosts_record_reads_this_machine_and_keeps_an_engines_facts_only_where_it_has_some() -> None:
    got = record("cpu", {"llamacpp": {"version": "1", "AMX_INT8": "1"}, "reference": {}})
    assert got.cpu_model == cpu_model_of(Path("/proc/cpuinfo").read_text()) and got.cores == os.cpu_count()
    assert got.cpu_flags == kernel_flags() and got.engine == {"llamacpp": {"version": "1", "AMX_INT8": "1"}}
    assert set(got.to_json()) == {"cpu_model", "cpu_flags", "cores", "gpu", "engine"}
    assert got.to_json()["engine"] == {"llamacpp": {"version": "1", "AMX_INT8": "1"}}
