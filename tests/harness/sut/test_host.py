"""The CPU flags a run records and a declaration may need, read from /proc/cpuinfo's text."""
from __future__ import annotations

from harness.sut.host import KERNEL_FLAGS, cpu_flags, flags_of, kernel_flags

X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 xsave\n\nprocessor\t: 1\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve crc32\n"


def test_the_first_cpus_flags_are_read_on_x86_and_arm() -> None:
    assert flags_of(X86) == {"fpu", "sse4_2", "avx2", "avx512f", "avx512_bf16", "xsave"}
    assert flags_of(ARM) == {"fp", "asimd", "sve", "crc32"}
    assert flags_of("processor\t: 0\n") == frozenset()


def test_a_run_records_the_kernel_flags_this_cpu_has_in_their_order() -> None:
    got = kernel_flags()
    assert set(got) <= cpu_flags() and set(got) == cpu_flags() & set(KERNEL_FLAGS)
    assert got == sorted(got, key=KERNEL_FLAGS.index)
