"""An engine's script writers are declared in its ``Engine`` (``writers``) and found by program name: each built-in
program's writer, a user engine's own, and a program without one refused naming those that have one."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from harness import sut
from harness.sut.script.writer import NoScript, ScriptWriter

#: the programs the built-in engines write scripts for.
PROGRAMS = ("reference", "vllm", "llamacpp")


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_built_in_program_has_its_writer(program: str) -> None:
    writer = sut.script_writer(program)
    assert isinstance(writer, ScriptWriter) and writer.engine == program
    assert list(sut.script_writers())[: len(PROGRAMS)] == list(PROGRAMS)


def test_a_program_without_a_writer_is_refused_naming_those_with_one() -> None:
    with pytest.raises(NoScript, match=r"sglang: no reproducer script writer yet \(writers: reference, vllm, llamacpp"):
        sut.script_writer("sglang")


@pytest.fixture
def toy() -> Iterator[str]:
    """A user engine registered with one field more than the reference's: a writer of its own program."""
    reference = sut.engine("reference")
    levels = dataclasses.replace(reference.levels, name="toy_writer")
    sut.register(dataclasses.replace(reference, levels=levels,
                                     writers={"toy_writer": "harness.sut.reference.script:WRITER"}))
    try:
        yield "toy_writer"
    finally:
        sut.unregister("toy_writer")


def test_a_user_engine_declares_its_writer_in_its_engine(toy: str) -> None:
    assert sut.script_writers()[toy] == "harness.sut.reference.script:WRITER"
    assert sut.script_writer(toy) is sut.script_writer("reference")
