"""The two extension axes, used from this file alone: a toy oracle and a toy engine, registered here and nowhere
else, judge and serve a real run; their verdicts reach results.jsonl, summary.json, the report and the listings."""
from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

from fixtures.workloads import Workload
from harness import oracles, sut
from harness.cli.main import main
from harness.oracles.view import Oracle, PassView
from harness.results.rows import Verdict
from harness.sut.base import CacheTraits, CellEngine, Engine, PassResult, SpecTraits, Totals, Traits
from harness.sut.levels import EngineLevels, LevelError
from reference_impl.request import RequestOutput, RequestSpec


# -- a toy oracle: fails every cell whose cache is on --------------------------------------------------------------

def cache_is_off(views: Sequence[PassView]) -> Verdict:
    cached = [v.workload for v in views if v.traits.cache.enabled]
    if cached:
        return Verdict("toy_cache_off", "fail", f"the cache is on in {cached[0]}", [{"workload": cached[0]}])
    return Verdict("toy_cache_off", "pass", "the cache is off")


TOY_ORACLE = Oracle("toy_cache_off", "the cell's cache is on (a toy, registered by its test)", cache_is_off)

# -- a toy engine: counts up from the last prompt token; level bug=on loses the last request of a round --------------


class CountingSystem:
    """Each request's next token is the last one plus 1 (mod 100), with a confident logprob."""

    def __init__(self, levels: Mapping[str, object]) -> None:
        self.bug = levels["bug"] == "on"
        self.traits = Traits(dtype=torch.float32, model="toy", hybrid=False, deterministic=False,
                             spec=SpecTraits(), cache=CacheTraits(enabled=False, page_size=1, chunk_size=1,
                                                                  state_interval=1), audited=False)

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        outputs = [self._one(r) for group in rounds for r in (group[:-1] if self.bug else group)]
        return PassResult(outputs=outputs)

    @staticmethod
    def _one(request: RequestSpec) -> RequestOutput:
        tokens = [(request.prompt[-1] + step) % 100 for step in range(1, request.max_new_tokens + 1)]
        n = len(tokens)
        return RequestOutput(rid=request.rid, tokens=tokens, logprobs=[-0.01] * n, top_ids=[[t, 0] for t in tokens],
                             top_logprobs=[[-0.01, -5.0]] * n, margins=[4.99] * n, cached_tokens=0,
                             finish_reason="length")

    def totals(self) -> Totals:
        return Totals(stats={})

    def close(self) -> None:
        pass


class CountingEngine:
    def __init__(self, levels: Mapping[str, object]) -> None:
        self.levels = levels

    def session(self, workload: Workload) -> CountingEngine:
        return self

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> CountingSystem:
        return CountingSystem(self.levels)

    def close(self) -> None:
        pass


def check_toy(factor: str, level: object) -> None:
    if factor != "bug":
        raise KeyError(factor)
    if level not in ("off", "on"):
        raise LevelError(f"level {level!r} of 'bug' is not one of off, on")


def open_toy(levels: Mapping[str, object], faults: frozenset[str], device: str,
             engine_args: Mapping[str, object]) -> CellEngine:
    return CountingEngine({**TOY_LEVELS.defaults, **levels})


TOY_LEVELS = EngineLevels(name="toy", defaults=MappingProxyType({"bug": "off", "spec": "none", "model": "toy"}),
                          kept_from_cell=frozenset({"model"}), factors=("bug",), check=check_toy,
                          describe=lambda factor: "`off`, `on`")
TOY_ENGINE = Engine(levels=TOY_LEVELS, open=open_toy)


@pytest.fixture
def registered() -> Iterator[None]:
    oracles.register(TOY_ORACLE)
    sut.register(TOY_ENGINE)
    try:
        yield
    finally:
        oracles.unregister(TOY_ORACLE.name)
        sut.unregister(TOY_ENGINE.name)


def run(tmp_path: Path, matrix: str, **files: str) -> tuple[int, Path]:
    path = tmp_path / f"{matrix}.toml"
    path.write_text(files[matrix])
    out = tmp_path / "out"
    code = main(["run", "--matrix", str(path), "--report-dir", str(out), "-j", "1"])
    return code, out


REFERENCE_MATRIX = """
[matrix]
name = "with_toy_oracle"
mode = "full"
workloads = ["pair"]
[factors]
cache = ["off", "device"]
"""

TOY_MATRIX = """
[matrix]
name = "toy_engine"
engine = "toy"
mode = "full"
workloads = ["pair"]
[factors]
bug = ["off", "on"]
"""


def test_a_toy_oracle_registered_here_judges_every_cell(registered: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(tmp_path, "with_toy_oracle", with_toy_oracle=REFERENCE_MATRIX)
    assert code == 1
    rows = {json.loads(line)["factors"]["cache"]: json.loads(line) for line in (out / "results.jsonl").open()}
    assert rows["off"]["oracles"]["toy_cache_off"]["verdict"] == "pass" and rows["off"]["status"] == "pass"
    assert rows["device"]["oracles"]["toy_cache_off"]["verdict"] == "fail" and rows["device"]["status"] == "fail"
    assert json.loads((out / "summary.json").read_text())["oracle_failures"] == {"toy_cache_off": 1}
    assert "the cache is on in pair" in (out / "index.html").read_text()
    capsys.readouterr()
    assert main(["oracles"]) == 0 and "toy_cache_off\n  fails when: the cell's cache is on" in capsys.readouterr().out


def test_a_toy_engine_registered_here_serves_and_is_judged(registered: None, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(tmp_path, "toy_engine", toy_engine=TOY_MATRIX)
    assert code == 1
    rows = {json.loads(line)["factors"]["bug"]: json.loads(line) for line in (out / "results.jsonl").open()}
    assert rows["off"]["status"] == "pass", rows["off"]
    assert rows["on"]["status"] == "fail" and rows["on"]["oracles"]["completeness"]["verdict"] == "fail"
    assert "never finished (lost)" in rows["on"]["oracles"]["completeness"]["message"]
    assert rows["on"]["oracles"]["pool_audit"]["verdict"] == "skip"  # the toy audits nothing, and says so
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["fail"] == 1 and summary["oracle_failures"] == {"completeness": 1}
    assert "/bug:on/" in (out / "index.html").read_text()
    capsys.readouterr()
    assert main(["factors", "--engine", "toy"]) == 0 and "toy: bug: off, on; default off" in capsys.readouterr().out
    assert math.isfinite(rows["off"]["metrics"]["wall_seconds"])
