"""The boundary stage: workloads of the boundary family (``fixtures/workloads/boundary.py``) drawn for one cell by
Hypothesis and served on its live engine, beside its references; a failing draw is shrunk by Hypothesis's shrinker.

The engines are the cell's own, brought up once (``harness.run.trial.Engines``): each draw is one run of the cell
and of its references on that draw, judged by every oracle as a fixed workload is. A Hypothesis test drives it: at
most ``draws`` draws (its ``max_examples``), seeded by the cell id (``--cell`` draws the same), then the shrink of
the first that fails, while the same check fails, within ``shrink_runs`` runs. The example database
(``examples_db``: the report directory's, or one a nightly keeps) holds the shrunk draw under the cell's key, and
Hypothesis replays it first the next time that cell draws. The row records every draw's shapes and verdict.
"""
from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fixtures.workloads import Workload
from fixtures.workloads.boundary import Draw, Seams, draws
from harness import sut
from harness.matrix.model import BoundarySettings
from harness.oracles.view import PassView
from harness.results.rows import Verdict, error_line, error_type
from harness.run.judge import judge, pass_views
from harness.run.plan import CellPlan
from harness.run.serve import CellTimeout, WorkloadRun, serve_workload
from harness.run.trial import Engines, ReferenceFailed, References
from harness.sut.base import Traits

#: bump when a draw's meaning changes: entries saved under an older key are not replayed as something else
FAMILY_VERSION = 1
OnStep = Callable[[str], None]
#: the suffix of the key Hypothesis keeps a failure's larger, superseded draws under
SECONDARY = b".secondary"


class _Abort(BaseException):
    """Carries what must end the cell (its deadline) through Hypothesis, which treats an ``Exception`` as a failure."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def seed_of(cell_id: str) -> int:
    """The seed a cell draws with: its id's digest, so the same cell draws the same workloads on any host."""
    return int.from_bytes(hashlib.sha256(cell_id.encode()).digest()[:8], "big")


def database_key(plan: CellPlan) -> bytes:
    """The key a cell's failing draws are saved under: family version, matrix, cell and injected faults."""
    return f"kvmatrix-boundary-v{FAMILY_VERSION}:{plan.matrix}:{plan.cell_id}:{','.join(sorted(plan.faults))}".encode()


def cell_seams(plan: CellPlan, traits: Traits | None = None) -> Seams:
    """Where ``plan``'s cell draws: its engine's seams for its levels, the page the engine applied where a run read it
    back (``traits``), the family's cap from ``[boundary] max_tokens``."""
    engine = sut.engine(plan.engine)
    seams = engine.seams(engine.levels.full(plan.levels), plan.engine_args)
    if seams is None:
        raise ValueError(f"engine {plan.engine!r} does not say its cells' seams")
    page = traits.cache.page_size if traits is not None else seams.page
    return Seams(page, seams.budget, seams.k, seams.context, seams.vocab, plan.boundary.max_tokens)


@dataclass(slots=True)
class Tried:
    """One draw as the cell served it: its workload's name, the phase that drew it, what failed (empty: it passed),
    and its runs (the cell's and its references') or the traceback of what the cell raised."""

    name: str
    draw: Draw
    phase: str  # "replay" (from the example database), "draw", "shrink"
    failing: list[str]
    run: WorkloadRun | None = None
    references: dict[str, WorkloadRun] = field(default_factory=dict)
    error: str | None = None

    def to_json(self, seams: Seams) -> dict:
        """What the row keeps: name, phase, shapes (labels), requests, prompt lengths, verdict, the draw itself."""
        requests = self.draw.requests(seams)
        out = {"name": self.name, "phase": self.phase, "shapes": self.draw.labels(seams), "requests": len(requests),
               "prompt_tokens": [len(r.prompt) for r in requests], "failed": self.failing, "draw": self.draw.to_json()}
        return {**out, "error": error_line(self.error)} if self.error else out


@dataclass(slots=True)
class Explored:
    """A cell's boundary stage: its seams and seed, the draws served (shrink candidates counted, not kept), the shrunk
    failing draw (None when every draw passed), the engine runs it spent and its seconds."""

    settings: BoundarySettings
    seams: Seams
    seed: int
    database: str | None
    saved: int  # draws the example database held for this cell before the stage
    tried: list[Tried]
    shrunk: Tried | None
    shrink_runs: int
    seconds: float

    def views(self, plan: CellPlan) -> list[PassView]:
        """What the oracles judge: the draws that passed, and the shrunk draw that failed."""
        kept = [t for t in self.tried if not t.failing] + ([self.shrunk] if self.shrunk else [])
        return [view for t in kept if t.run is not None
                for view in pass_views(t.run, t.references, plan.tolerances, plan.known)]

    def to_json(self) -> dict:
        return {"settings": {key: getattr(self.settings, key) for key in ("draws", "shrink_runs", "shapes", "max_tokens")},
                "seams": self.seams.to_json(), "seed": self.seed, "database": self.database, "saved": self.saved,
                "draws": [t.to_json(self.seams) for t in self.tried],
                "shrunk": self.shrunk.to_json(self.seams) if self.shrunk else None,
                "shrink_runs": self.shrink_runs, "seconds": round(self.seconds, 4)}


class _Search:
    """Hypothesis's condition on one cell: serve a draw, judge it, say whether it fails the check the first failure
    failed (a shrink keeps that check); a draw already served is never served again, and a spent budget says no.

    A draw is judged beside the cell's fixed workloads (``fixed``), as the row judges it: it fails the oracles that
    fail with it and pass without it. An oracle that judges the cell as a whole (``pressure``: some workload made the
    engine preempt; ``accept_length``'s "the proposer drafted at all") is met by the workloads written for it, so a
    draw too short to press the pool or to draft is not a failure of its own.
    """

    def __init__(self, plan: CellPlan, engines: Engines, seams: Seams, saved: int, step: OnStep,
                 fixed: Sequence[PassView]) -> None:
        self.plan, self.engines, self.seams, self.saved, self.step = plan, engines, seams, saved, step
        self.fixed = list(fixed)
        self.already = {name for name, verdict in judge(self.fixed).items() if verdict.status == "fail"} \
            if self.fixed else set()
        self.references = References(engines)
        self.served: dict[Draw, Tried] = {}
        self.primary: str | None = None  # the check the first failing draw failed
        self.shrink_runs = 0

    def fails(self, draw: Draw) -> bool:
        if draw not in self.served:
            if self.primary is not None and self.shrink_runs >= self.plan.boundary.shrink_runs:
                return False  # the shrink's budget is spent: the smallest failing draw so far stands
            phase = "shrink" if self.primary is not None else ("replay" if len(self.served) < self.saved else "draw")
            self.shrink_runs += phase == "shrink"
            self.served[draw] = self._serve(draw, f"boundary-{len(self.served) + 1}", phase)
            failing = self.served[draw].failing
            if self.primary is None and failing:
                self.primary = failing[0]
        return self.primary is not None and self.primary in self.served[draw].failing

    def _serve(self, draw: Draw, name: str, phase: str) -> Tried:
        """Run the cell and its references on ``draw``; what the cell raised is its outcome, a reference's is none."""
        plan, workload = self.plan, draw.workload(self.seams, name)
        self.step(f"{name}/golden")
        try:
            references = {ref: self.references.get(config, workload) for ref, config in plan.goldens.items()}
        except ReferenceFailed as exc:
            if isinstance(exc.__cause__, CellTimeout):
                raise _Abort(exc.__cause__) from None
            return Tried(name, draw, phase, [], error=str(exc))
        own = plan.served_as()
        try:
            run = references[own] if own is not None else serve_workload(self._engine(), workload, self.step)
        except CellTimeout as exc:
            raise _Abort(exc) from None
        except Exception as exc:  # the cell's own crash is what the draw found
            self.engines.drop(plan.engine, plan.levels, plan.faults, plan.engine_args)
            error = "".join(traceback.format_exception(exc)).strip()
            return Tried(name, draw, phase, [f"error: {error_type(error)}"], error=error)
        verdicts: dict[str, Verdict] = judge(self.fixed + pass_views(run, references, plan.tolerances, plan.known))
        failing = sorted(name for name, verdict in verdicts.items()
                         if verdict.status == "fail" and name not in self.already)
        return Tried(name, draw, phase, failing, run, references)

    def _engine(self):
        plan = self.plan
        return self.engines.get(plan.engine, plan.levels, plan.faults, plan.engine_args)


class _Failed(Exception):
    """Raised inside Hypothesis's test for a draw that fails: Hypothesis shrinks it, then raises it with the smallest."""

    def __init__(self, draw: Draw) -> None:
        super().__init__("a boundary draw failed")
        self.draw = draw


def explore(plan: CellPlan, engines: Engines, seams: Seams, step: OnStep | None = None,
            fixed: Sequence[PassView] = ()) -> Explored:
    """Draw ``plan.boundary.draws`` workloads at ``seams`` on the cell's engines, shrink the first that fails; each
    draw judged beside the views of the cell's fixed workloads (``fixed``)."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    started, key = time.perf_counter(), database_key(plan)
    database = DirectoryBasedExampleDatabase(plan.examples_db) if plan.examples_db else None
    # Hypothesis replays the shrunk draws (its primary corpus) and, where they are few, the failing draws a shrink
    # left behind (its secondary one): a replayed shrunk draw that fails again is reported as it is, any other shrinks
    saved = sum(len(list(database.fetch(k))) for k in (key, key + SECONDARY)) if database is not None else 0
    search = _Search(plan, engines, seams, saved, step or (lambda what: None), fixed)
    shrunk = None
    try:
        _hypothesis_test(plan, seams, search, database, key)()
    except _Failed as failed:
        shrunk = search.served[failed.draw]
    except _Abort as abort:
        raise abort.cause from None
    tried = [t for t in search.served.values() if t.phase != "shrink"]
    return Explored(plan.boundary, seams, seed_of(plan.cell_id), plan.examples_db, saved, tried, shrunk,
                    search.shrink_runs, time.perf_counter() - started)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A row's failing draw, as workloads: the shrunk one, the one it was shrunk from, the runs the shrink spent."""

    shrunk: Workload
    original: Workload
    runs: int


def recorded(row: Mapping[str, object]) -> Recorded | None:
    """What a row's boundary stage kept of its failure (``metrics.boundary``), None where no draw failed: the same
    workloads the cell served, rebuilt from the draws and seams it recorded."""
    found = (row.get("metrics") or {}).get("boundary")
    if not isinstance(found, Mapping) or not found.get("shrunk"):
        return None
    seams, shrunk = Seams.from_json(found["seams"]), found["shrunk"]
    first = next((d for d in found.get("draws", []) if d.get("failed")), shrunk)
    return Recorded(Draw.from_json(shrunk["draw"]).workload(seams, shrunk["name"]),
                    Draw.from_json(first["draw"]).workload(seams, first["name"]), int(found.get("shrink_runs", 0)))


def preview(plan: CellPlan, seams: Seams) -> list[Draw]:
    """The draws ``plan``'s cell makes when none fails, in order, without an engine: what its row will record."""
    drawn: list[Draw] = []

    class Recorder:
        def fails(self, draw: Draw) -> bool:
            drawn.append(draw)
            return False

    _hypothesis_test(plan, seams, Recorder(), None, database_key(plan))()
    return drawn


def _hypothesis_test(plan: CellPlan, seams: Seams, search: object, database: object, key: bytes) -> Callable[[], None]:
    """The cell's search as a Hypothesis test: ``draws`` examples seeded by the cell id, reuse, generate and shrink
    phases, the example database under ``key``.

    ``find`` and ``@seed`` would drop the database (Hypothesis keeps none for a seeded run, meant to reproduce one
    failure); the test is built as ``find`` builds its own, with the seed and the key set on it directly.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings

    @settings(max_examples=plan.boundary.draws, database=database, deadline=None, verbosity=Verbosity.quiet,
              phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink), print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(draws(seams, plan.boundary.shapes))
    def search_cell(draw: Draw) -> None:
        if search.fails(draw):
            raise _Failed(draw)

    search_cell._hypothesis_internal_use_seed = seed_of(plan.cell_id)
    search_cell._hypothesis_internal_database_key = key
    return search_cell
