"""The golden stage: golden runs, computed once per (engine, golden levels, workload) on one device and reused by
every cell that reads them."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from fixtures.workloads import Workload, load_workload
from harness import sut
from harness.run.serve import WorkloadRun, run_workload, serve_workload

#: a golden run's identity: engine, its arguments (JSON), every level with defaults filled in, workload name.
GoldenKey = tuple[str, str, tuple[tuple[str, object], ...], str]


def golden_key(levels: Mapping[str, object], workload: str, engine: str = "reference",
               engine_args: Mapping[str, object] | None = None) -> GoldenKey:
    """The identity of a golden run: the engine and its arguments, every level (defaults filled in), the workload."""
    full = tuple(sorted(sut.engine(engine).levels.full(levels).items(), key=lambda kv: kv[0]))
    return engine, json.dumps(dict(engine_args or {}), sort_keys=True), full, workload


class GoldenRuns:
    """Golden runs on one device, each computed once and reused by every cell.

    ``put`` hands in a run computed elsewhere (a worker process of ``harness run -j``), counted as computed.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._runs: dict[GoldenKey, WorkloadRun] = {}
        self.computed = 0
        self.reused = 0

    def __contains__(self, key: GoldenKey) -> bool:
        return key in self._runs

    def get(self, key: GoldenKey, workload: Workload | None = None) -> WorkloadRun:
        """The run ``key`` names, computed now if it is not here."""
        if key in self._runs:
            self.reused += 1
        else:
            self._runs[key] = self.compute(key, self.device, workload)
            self.computed += 1
        return self._runs[key]

    def prefetch(self, keys: Sequence[GoldenKey]) -> None:
        """Compute the runs of ``keys`` (one engine configuration, several workloads) not yet here on one engine
        brought up once: a real engine starts in seconds and serves a workload in a fraction of that (``get`` then
        counts them as reused)."""
        missing = [key for key in dict.fromkeys(keys) if key not in self._runs]
        if len(missing) < 2:
            return
        engine, engine_args, levels, _ = missing[0]
        with sut.opened(engine, dict(levels), frozenset(), self.device, json.loads(engine_args)) as cell_engine:
            for key in missing:
                self.put(key, serve_workload(cell_engine, load_workload(key[3])))

    @staticmethod
    def compute(key: GoldenKey, device: str, workload: Workload | None = None) -> WorkloadRun:
        """The golden run ``key`` names, on ``device``: no fault, on an engine of its own."""
        engine, engine_args, levels, name = key
        return run_workload(dict(levels), workload or load_workload(name), frozenset(), device, engine=engine,
                            engine_args=json.loads(engine_args))

    def put(self, key: GoldenKey, run: WorkloadRun) -> None:
        """Keep a golden run computed elsewhere."""
        self._runs[key] = run
        self.computed += 1

    def runs(self, keys: Sequence[GoldenKey]) -> dict[GoldenKey, WorkloadRun]:
        """The runs of ``keys``, to hand to a worker process."""
        return {key: self._runs[key] for key in keys}
