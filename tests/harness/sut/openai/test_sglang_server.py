"""SGLang's server read back (``harness.sut.openai.sglang``): the launch's flags as ``ServerArgs`` fields, what
``/server_info`` says SGLang resolved them to, the radix cache rule a cell is judged by, and the changes SGLang's own
rules make shown with their citation where any other change defeats the cell.

The responses in tests/data/servers/sglang/server_info_*.json were captured from SGLang 0.5.23 on this project's CPU
(``make sglang-env``), cut to the fields read; server_args_ngram_log.json is the ``server_args=`` line of an NGRAM
server's log (it died at its warm-up, the declared crash of matrices/sglang_cpu.toml, before ``/server_info`` could
answer). README.md there says how.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.matrix.file import load_matrix
from harness.oracles import applied as applied_oracle
from harness.sut.host import flags_of
from harness.sut.openai import LEVELS
from harness.sut.openai.engine import server_traits
from harness.sut.openai.launch import Launch
from harness.sut.openai.sglang import RADIX, asked, judged_traits, read_back
from harness.sut.openai.wire import ServerError

DATA = Path(__file__).resolve().parents[3] / "data" / "servers" / "sglang"
HOSTS = Path(__file__).resolve().parents[3] / "data" / "hosts"
CPU = load_matrix("sglang_cpu").engine_args


def recorded(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def cell(**levels: object) -> tuple[dict, list[str]]:
    """A sglang_cpu cell's full levels and its launch's argv, as the matrix renders them; torch_native in fp32, as the
    responses were captured (on the EPYC, before the matrix moved to bf16 for a CPU with AMX)."""
    full = LEVELS.full({"model": "dense", "attention_backend": "torch_native", "dtype": "float32", "cache": "device",
                        "page_size": 16, "prefill_budget": 4096, "spec": "none", "num_draft_tokens": 3, **levels})
    return full, Launch(CPU, full, 30001).argv


def judged(info: dict, **levels: object):
    full, argv = cell(**levels)
    return judged_traits(server_traits(CPU, full), argv, info)


def applied_verdict(traits):
    return applied_oracle.judge([SimpleNamespace(traits=traits, known=())])


def test_the_launch_reads_as_server_args_fields() -> None:
    argv = ["--page-size", "1", "--page-size=16", "--disable-radix-cache", "--attention-backend", "triton",
            "--speculative-algorithm", "NGRAM", "--model-path", "/m"]
    got = asked(argv)
    assert got["page_size"] == 16 and got["disable_radix_cache"] is True and got["attention_backend"] == "triton"
    assert got["speculative_algorithm"] == "NGRAM" and "model_path" not in got
    assert got["enable_deterministic_inference"] is False  # a switch the launch leaves out is off
    with pytest.raises(ServerError, match="ends at --page-size"):
        asked(["--page-size"])
    with pytest.raises(ServerError, match="--chunked-prefill-size 'lots' does not read"):
        asked(["--chunked-prefill-size", "lots"])


def test_a_radix_cell_is_judged_by_sglangs_rule_on_what_it_applied() -> None:
    traits = judged(recorded("server_info_radix_page16"))
    assert traits.cache.enabled and traits.cache.page_size == 16 and traits.cache.rule is RADIX
    assert "_compute_max_prefix_len" in RADIX.name
    assert not [a for a in traits.applied if a.changed]
    assert {a.what for a in traits.applied} >= {"page_size", "chunked_prefill_size", "disable_radix_cache",
                                                "attention_backend", "dtype"}
    assert applied_verdict(traits).status == "pass"


def test_the_radix_cache_off_is_judged_off() -> None:
    traits = judged(recorded("server_info_radix_off"), cache="off", page_size=1)
    assert not traits.cache.enabled and traits.cache.page_size == 1


#: the CPU flags of the two hosts SGLang ran on here (tests/data/hosts): an AMD EPYC without AMX, where the fallback
#: was captured, and an Intel Xeon with it
EPYC, XEON_AMX = (flags_of((HOSTS / f"cpuinfo_{name}.txt").read_text()) for name in ("epyc", "xeon_amx"))


def test_a_documented_fallback_is_shown_with_its_rule_and_judged_as_applied() -> None:
    """Asked intel_amx on a CPU without AMX, SGLang ran torch_native (captured): shown, cited, not a failure."""
    info = recorded("server_info_intel_amx_fallback")
    argv = asked(info["launch_command"].split())
    (backend,) = [a for a in read_back(argv, info, EPYC) if a.what == "attention_backend"]
    assert (backend.asked, backend.used, backend.defeats) == ("intel_amx", "torch_native", "")
    assert "_attention_backend_platform_fallbacks" in backend.describe()


def test_the_same_fallback_on_a_cpu_with_amx_defeats_the_cell() -> None:
    """SGLang falls back only where the CPU lacks AMX: on a host with amx_tile, torch_native for intel_amx is no rule's
    change, so the cell that tests intel_amx is defeated, not excused."""
    info = recorded("server_info_intel_amx_fallback")
    (backend,) = [a for a in read_back(asked(info["launch_command"].split()), info, XEON_AMX)
                  if a.what == "attention_backend"]
    assert backend.used == "torch_native" and backend.defeats and not backend.rule


def test_the_fallback_rule_reads_the_host_the_harness_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without recorded flags the rule takes this machine's (the server is local): as the AMX host, the fallback
    defeats; as the EPYC, it is excused."""
    from harness.sut.openai import sglang

    info = recorded("server_info_intel_amx_fallback")
    argv = asked(info["launch_command"].split())
    for flags, excused in ((XEON_AMX, False), (EPYC, True)):
        monkeypatch.setattr(sglang, "cpu_flags", lambda flags=flags: flags)
        (backend,) = [a for a in read_back(argv, info) if a.what == "attention_backend"]
        assert (not backend.defeats) == excused


def test_a_change_no_rule_explains_defeats_the_cell() -> None:
    """The same fallback's answer on a machine SGLang's rule does not cover (a GPU) fails the applied oracle."""
    info = {**recorded("server_info_intel_amx_fallback"), "device": "cuda"}
    argv = asked(info["launch_command"].split())
    (backend,) = [a for a in read_back(argv, info, EPYC) if a.what == "attention_backend"]
    assert backend.defeats and not backend.rule
    info = {**recorded("server_info_radix_page16"), "disable_radix_cache": True}
    traits = judged(info)
    assert not traits.cache.enabled
    verdict = applied_verdict(traits)
    assert verdict.status == "fail" and "turned it off" in verdict.message


def test_deterministic_inference_on_flashinfer_keeps_no_radix_cache_by_sglangs_rule() -> None:
    """A GPU cell's answer (written from the captured one: flashinfer does not run here): the radix cache asked on,
    resolved off under deterministic inference; judged with the cache off, the change cited, the cell not failed."""
    info = {**recorded("server_info_radix_page16"), "attention_backend": "flashinfer",
            "enable_deterministic_inference": True, "disable_radix_cache": True}
    argv = cell()[1] + ["--attention-backend", "flashinfer", "--enable-deterministic-inference"]
    traits = judged_traits(server_traits(CPU, cell()[0]), argv, info)
    assert not traits.cache.enabled
    (radix,) = [a for a in traits.applied if a.what == "disable_radix_cache"]
    assert radix.changed and not radix.defeats and "_handle_deterministic_inference" in radix.rule
    assert applied_verdict(traits).status == "pass"
    on_triton = {**info, "attention_backend": "triton"}  # triton keeps the radix cache: the same change defeats
    argv = cell()[1] + ["--attention-backend", "triton", "--enable-deterministic-inference"]
    (radix,) = [a for a in read_back(asked(argv), on_triton) if a.what == "disable_radix_cache"]
    assert radix.defeats and not radix.rule


def test_the_ngram_launch_reads_back_as_asked() -> None:
    traits = judged(recorded("server_args_ngram_log"), spec="ngram", page_size=1, prefill_budget=64)
    spec = {a.what: a for a in traits.applied if a.what.startswith("speculative_")}
    assert (spec["speculative_algorithm"].used, spec["speculative_num_draft_tokens"].used) == ("NGRAM", 3)
    assert not [a for a in traits.applied if a.changed]


def test_an_answer_without_a_field_read_is_an_error_naming_it() -> None:
    info = recorded("server_info_radix_page16")
    del info["page_size"], info["dtype"]
    with pytest.raises(ServerError, match="no dtype, page_size"):
        judged(info)
