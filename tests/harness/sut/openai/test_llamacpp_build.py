"""llama-server's build as a run records it (harness/sut/openai/llamacpp_build.py): ``--version``'s facts and the
CPU features ggml compiled, from the output recorded on an AMX Xeon and an EPYC without AMX (tests/data/hosts), and
from the binary ``make llama-server`` built here."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.sut.host import cpu_flags
from harness.sut.openai.launch import llama_server_path
from harness.sut.openai.llamacpp_build import build, features, probe, program_path, version_facts
from tests.binaries import required_path

DATA = Path(__file__).resolve().parents[3] / "data" / "hosts"
SERVER = {"api": "llamacpp", "command": ["{llama_server}", "-m", "{gguf}", "--port", "{port}"]}


def recorded(name: str) -> str:
    return (DATA / f"llamacpp_{name}.txt").read_text()


def test_the_version_and_compiler_are_read_in_both_formats() -> None:
    assert version_facts("version: 0.0.1 (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n") == {
        "version": "0.0.1", "build": "1", "commit": "0c1e570", "compiler": "GNU 12.2.0", "target": "Linux x86_64"}
    assert version_facts("version: 4589 (0c1e570)\n") == {"version": "4589", "commit": "0c1e570"}
    assert version_facts("usage: llama-server ...") == {}


def test_the_cpu_features_of_an_amx_build_and_of_an_avx512_one() -> None:
    xeon, epyc = features(recorded("xeon_amx")), features(recorded("epyc"))
    assert xeon["AMX_INT8"] == "1" and xeon["AVX512"] == "1" and xeon["REPACK"] == "1"
    assert epyc["AVX512"] == "1" and epyc["AVX512_BF16"] == "1" and "AMX_INT8" not in epyc
    assert "n_threads" not in " ".join(xeon) and version_facts(recorded("xeon_amx"))["commit"] == \
        version_facts(recorded("epyc"))["commit"]


def test_another_backends_features_carry_its_name() -> None:
    line = "system_info: n_threads = 8 / 16 | CUDA : ARCHS = 900 | USE_GRAPHS = 1 | CPU : AVX2 = 1 | SVE_CNT = 16 |"
    assert features(line) == {"CUDA ARCHS": "900", "CUDA USE_GRAPHS": "1", "AVX2": "1", "SVE_CNT": "16"}
    assert features("no such line") == {}


def test_a_program_that_is_not_here_or_named_per_cell_has_no_build() -> None:
    assert program_path({"command": ["/nonexistent/llama-server"]}) is None
    assert build({"api": "llamacpp", "command": ["/nonexistent/llama-server"]}) == {}
    assert program_path({"command": ["{level}"]}) is None


@pytest.mark.llamacpp
def test_the_llama_server_built_here_reports_the_features_this_cpu_gave_it() -> None:
    """GGML_NATIVE compiles what this CPU has: AMX_INT8 where it has AMX-INT8 (and AVX512-VNNI), AVX2 where AVX2."""
    binary = required_path(llama_server_path(), "llama-server")
    facts = build(SERVER)
    assert facts["commit"] and facts["compiler"] and facts == probe(binary.resolve(), binary.stat().st_mtime_ns)
    have = cpu_flags()
    assert ("AMX_INT8" in facts) == ({"amx_int8", "avx512_vnni"} <= have), facts
    assert ("AVX2" in facts) == ("avx2" in have) and ("AVX512" in facts) == ("avx512f" in have), facts
