"""Every engine's ``serve`` watched: the rounds of requests the runner hands a system must come back as they went in.

``harness.sut.opened`` hands every engine to the runner through ``WatchedEngine``, so a user's own engine is judged by
the ``inputs`` oracle as the built-in ones are; an engine's own APIs are watched where its package calls them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from fixtures.workloads import Workload
from harness.sut.base import CellEngine, PassResult, Session, SystemUnderTest, Totals, Traits
from harness.sut.inputs import ABSENT, CALL, Watch, at
from reference_impl.request import RequestSpec


#: the serve check's ``where``: the runner's requests are in the harness's process, with the engine package's code.
SERVE_WHERE = "the engine's serve, in the harness's process (an engine in another process: the harness's side of it)"


def rounds_view(rounds: Sequence[Sequence[RequestSpec]]) -> Callable[[], dict[str, object]]:
    """The view of one ``serve``'s rounds: each request by its rid (as it was when the view was made, so that a
    request whose rid the engine changed is still found by its place), and the rounds' rids in order under ``CALL``
    (a request the engine dropped, added or reordered)."""
    places = [(r, i, str(getattr(spec, "rid", f"round {r} request {i}")))
              for r, group in enumerate(rounds) for i, spec in enumerate(group)]

    def view() -> dict[str, object]:
        held = {rid: at(rounds[r], i) if r < len(rounds) else ABSENT for r, i, rid in places}
        return {**held, CALL: {"rounds": [[getattr(spec, "rid", ABSENT) for spec in group] for group in rounds]}}

    return view


class WatchedSystem:
    """A system whose every ``serve`` is watched: the rounds the runner hands it must come back as they went in
    (``InputsCheck`` "serve", first in the pass's ``inputs``, before the engine's own APIs')."""

    def __init__(self, system: SystemUnderTest) -> None:
        self.system = system

    @property
    def traits(self) -> Traits:
        return self.system.traits

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult:
        watch = Watch(rounds_view(rounds))
        result = self.system.serve(rounds)
        result.inputs.insert(0, watch.check("serve", SERVE_WHERE))
        return result

    def totals(self) -> Totals:
        return self.system.totals()

    def close(self) -> None:
        self.system.close()


class WatchedSession:
    """A session whose systems are watched (``WatchedSystem``)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> WatchedSystem:
        return WatchedSystem(self.session.open(tenant_suffix=tenant_suffix, alone=alone))

    def close(self) -> None:
        self.session.close()


class WatchedEngine:
    """A cell's engine, any engine, whose systems are watched (``WatchedSystem``)."""

    def __init__(self, engine: CellEngine) -> None:
        self.engine = engine

    def session(self, workload: Workload) -> WatchedSession:
        return WatchedSession(self.engine.session(workload))

    def close(self) -> None:
        self.engine.close()
