"""The ``[server]`` table's kernel-path levels: a level naming the CPU flags its path needs (``cpu``) is refused at
load on a host without them, naming the file, the factor, the level and the flag; recorded hosts of both kinds (an
Intel Xeon with AMX, an AMD EPYC without) go through the same check whatever machine runs the test."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.matrix.model import MatrixError
from harness.run.session import check_cpu_needs, check_runnable
from harness.sut.host import flags_of
from harness.sut.openai.launch import Launch
from tests.harness.sut.openai.test_engine import FAKE, MATRIX

AMX_XEON = flags_of("flags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 avx512_fp16 amx_tile amx_int8")
AMD_EPYC = flags_of("flags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 avx512_vnni")
KERNELS = """
[server.levels.cpu_kernels]
amx = { cpu = ["amx_tile"] }
plain = { flags = ["--no-repack"] }
"""


def kernel_matrix(tmp_path: Path, levels: str = KERNELS) -> Path:
    """The stand-in server's matrix with a kernel-path factor: ``amx`` needs amx_tile, ``plain`` is golden."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    text = MATRIX.replace("slots = [1]\n", 'slots = [1]\ncpu_kernels = ["amx", "plain"]\n', 1)
    text = text.replace("[golden]\nslots = 1\n", '[golden]\nslots = 1\ncpu_kernels = "plain"\n')
    path = tmp_path / "s.toml"
    path.write_text(text.format(timeout=60, model=tmp_path / "model", python=sys.executable, fake=FAKE, mode="ok",
                                pids=tmp_path / "pids", start_timeout=20, extra=levels))
    return path


def test_a_kernel_level_runs_where_the_cpu_has_its_flag_and_is_refused_where_not(tmp_path: Path) -> None:
    matrix = load_matrix(str(kernel_matrix(tmp_path)))
    check_runnable(matrix, "cpu", AMX_XEON)
    with pytest.raises(MatrixError) as refused:
        check_runnable(matrix, "cpu", AMD_EPYC)
    assert str(refused.value).split("/")[-1].startswith("s.toml: [factors] cpu_kernels: level 'amx' needs CPU flag(s) amx_tile, "
                                         "which this host's CPU lacks (it has sse4_2 avx2 avx512f avx512_vnni "
                                         "avx512_bf16)"), refused.value


def test_a_host_without_the_flag_runs_a_matrix_that_does_not_ask_for_the_level(tmp_path: Path) -> None:
    path = kernel_matrix(tmp_path)
    path.write_text(path.read_text().replace('cpu_kernels = ["amx", "plain"]', 'cpu_kernels = ["plain"]')
                    .replace('amx = { cpu = ["amx_tile"] }\n', ""))
    check_runnable(load_matrix(str(path)), "cpu", AMD_EPYC)


def test_the_needed_flags_add_nothing_to_the_launch(tmp_path: Path) -> None:
    server = load_matrix(str(kernel_matrix(tmp_path))).engine_args
    amx, plain = (Launch(server, {"slots": 1, "cpu_kernels": level, "model": "dense"}, 8000) for level in ("amx", "plain"))
    assert plain.argv[:-1] == amx.argv and plain.argv[-1] == "--no-repack"


@pytest.mark.parametrize("levels, needle", [
    (KERNELS.replace('"amx_tile"', '"amx"'), "[server.levels.cpu_kernels] amx.cpu: 'amx' is not a CPU flag kernels "
                                             "choose their path by"),
    (KERNELS.replace('["amx_tile"]', "[]"), "[server.levels.cpu_kernels] amx.cpu: expected a non-empty list"),
    (KERNELS.replace('["amx_tile"]', '"amx_tile"'), "expected a non-empty list of CPU flags, got 'amx_tile'"),
])
def test_a_bad_cpu_need_names_the_file_and_key(tmp_path: Path, levels: str, needle: str) -> None:
    with pytest.raises(MatrixError) as caught:
        load_matrix(str(kernel_matrix(tmp_path, levels)))
    assert needle in str(caught.value) and "s.toml" in str(caught.value), caught.value


@pytest.mark.parametrize("name, refused", [("xeon_amx", False), ("epyc", True)])
def test_the_amx_matrix_loads_on_the_recorded_amx_host_and_is_refused_on_the_other(name: str, refused: bool) -> None:
    """matrices/smollm2_llamacpp_amx.toml's kernel path needs amx_tile: the recorded Xeon runs it, the recorded EPYC
    refuses it at load with the flag named, whatever machine runs this test (the program's presence aside)."""
    from tests.recorded_hosts import DATA

    matrix = load_matrix("smollm2_llamacpp_amx")
    flags = flags_of((DATA / f"cpuinfo_{name}.txt").read_text())
    if not refused:
        check_cpu_needs(matrix, flags)
        return
    with pytest.raises(MatrixError, match=r"smollm2_llamacpp_amx.toml: \[factors\] cpu_kernels: level 'amx' needs "
                                          r"CPU flag\(s\) amx_tile, which this host's CPU lacks"):
        check_cpu_needs(matrix, flags)
