"""Systems under test: the protocol the runner drives (``base``) and the engines behind it, by matrix engine name."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from harness.matrix.levels import ENGINES
from harness.matrix.model import MatrixError, MatrixSpec, shown_path
from harness.sut.base import CellEngine


def check_runnable(spec: MatrixSpec, device: str) -> None:
    """Raise ``MatrixError`` (one line) when ``device`` is not here, or the engine refuses one of the matrix's
    levels on it: a matrix that cannot run is refused when it is loaded, never run into error cells."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise MatrixError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
                              f"run on a GPU machine, or with --device cpu")
    if spec.engine == "openai":
        from harness.sut.server import launch_problem

        problem = launch_problem(spec.engine_args)
        if problem is not None:
            raise MatrixError(f"{shown_path(spec.path)}: [server] command: {problem}")
    engine = ENGINES[spec.engine]
    levels = [(factor, level) for factor, values in spec.factors for level in values] + list(spec.golden.items())
    for factor, level in levels:
        reason = engine.refused(device, factor, level)
        if reason is not None:
            raise MatrixError(f"{shown_path(spec.path)}: [factors] {factor}: level {level!r} cannot run on "
                              f"--device {device}: {reason}")


@contextmanager
def opened(engine: str, levels: Mapping[str, object], faults: frozenset[str], device: str,
           engine_args: Mapping[str, object]) -> Iterator[CellEngine]:
    """The engine ``engine`` (a ``[matrix] engine`` name) brought up for one cell, closed when the block ends."""
    if engine == "reference":
        from harness.sut.reference import ReferenceEngine as kind
    elif engine == "vllm":
        from harness.sut.vllm import VllmEngine as kind
    elif engine == "openai":
        from harness.sut.server import ServerEngine as kind
    else:
        raise ValueError(f"unknown engine {engine!r}")
    cell_engine = kind(levels, faults, device, engine_args)
    try:
        yield cell_engine
    finally:
        cell_engine.close()
