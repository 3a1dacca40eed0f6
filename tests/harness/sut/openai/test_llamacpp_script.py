"""The llama.cpp reproducer's parts that need no llama.cpp: the launch it writes is the harness's with the binary, the
port and each GGUF by name; the GGUF it rebuilds is the one the harness serves; its HTTP client reads a
``/completion`` answer as the checks do (against the stand-in llama-server of ``tests/findings``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness import sut
from harness.matrix.file import load_matrix
from harness.models.gguf_export import gguf_file
from harness.models.recipes import RECIPES
from harness.sut.openai import llamacpp_script as writer, llamacpp_standalone as standalone
from harness.sut.script.writer import NoScript

ROOT = Path(__file__).resolve().parents[4]
STAND_IN = ROOT / "tests" / "findings" / "stand_in" / "bin" / "llama-server"


@pytest.fixture(scope="module")
def server() -> dict:
    return dict(load_matrix("llamacpp").engine_args)


def test_the_launch_names_the_binary_the_port_and_each_gguf(server: dict, monkeypatch) -> None:
    monkeypatch.setenv("KVMATRIX_LLAMA_SERVER", str(STAND_IN))  # the harness's binary, whichever it is
    levels = {"cache": "device", "spec": "draft", "num_draft_tokens": 2, "slots": 4, "cache_ram": 0,
              "kv_unified": "on", "flash_attn": "off", "kv_type": "f16"}
    setting = writer.launch(server, levels)
    argv = setting["argv"]
    assert argv[0] == "{llama_server}" and argv[argv.index("--port") + 1] == "{port}"
    assert argv[argv.index("-m") + 1] == "{dense}" and argv[argv.index("-md") + 1] == "{draft}"
    assert argv[argv.index("-np") + 1] == "4" and argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert not any(str(gguf_file("dense")) in arg or str(gguf_file("draft")) in arg or str(STAND_IN) in arg
               for arg in argv)
    assert setting["request"] == {"cache_prompt": True}
    off = writer.launch(server, {**levels, "cache": "off", "spec": "none"})
    assert off["request"] == {"cache_prompt": False} and "-md" not in off["argv"]


def test_a_server_of_another_wire_format_has_no_llamacpp_script(server: dict, monkeypatch) -> None:
    monkeypatch.setenv("KVMATRIX_LLAMA_SERVER", str(STAND_IN))
    with pytest.raises(NoScript, match="llama.cpp's llama-server alone"):
        writer.launch({**server, "api": "openai", "name": "vllm"}, {"cache": "off"})
    openai = sut.engine("openai")
    assert sut.script_writer(openai.program_name(server)) is writer.WRITER
    with pytest.raises(NoScript, match="sglang: no reproducer script writer"):
        sut.script_writer(openai.program_name({**server, "api": "sglang"}))


def test_the_inline_gguf_is_the_file_the_harness_serves(tmp_path: Path) -> None:
    from gguf import GGUFReader

    paths = standalone.build_ggufs({name: RECIPES[name] for name in ("dense", "draft")}, tmp_path)
    for name, path in paths.items():
        rebuilt = {t.name: t.data for t in GGUFReader(path).tensors}
        served = {t.name: t.data for t in GGUFReader(str(gguf_file(name))).tensors}
        assert rebuilt.keys() == served.keys(), name
        assert all((rebuilt[key] == served[key]).all() for key in served), name


def test_a_run_reads_tokens_logprobs_margins_and_cached_tokens(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER", str(STAND_IN))
    setting = {"argv": ["{llama_server}", "--port", "{port}", "-m", "{dense}"], "env": {}, "request": {}}
    rounds = [[("a", (1, 2, 3), 3, 0), ("b", (7,), 2, 0)], [("c", (9, 9), 1, 0)]]
    run = standalone.serve("s", setting, rounds, {"dense": str(tmp_path / "dense.gguf")}, tmp_path)
    assert run["raised"] is None and list(run["passes"]) == ["cold", "warm"]
    outputs = {out["rid"]: out for out in run["passes"]["warm"]["outputs"]}
    assert outputs["a"]["tokens"] == [4, 5, 6] and outputs["b"]["tokens"] == [8, 9] and outputs["c"]["tokens"] == [10]
    assert outputs["a"]["logprobs"] == [-0.1] * 3 and outputs["a"]["margins"] == pytest.approx([2.9] * 3)
    assert outputs["a"]["cached_tokens"] == 0 and outputs["a"]["finish_reason"] == "length"
    assert run["passes"]["cold"]["spec"] == {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}


def test_a_server_that_never_starts_is_the_runs_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_SERVER", "/bin/false")
    run = standalone.serve("s", {"argv": ["{llama_server}"], "env": {}, "request": {}}, [[("a", (1,), 1, 0)]], {},
                           tmp_path)
    assert run["raised"] == "ServerError: llama-server did not become healthy (exit status 1)" and not run["passes"]
