"""The system under test: the one narrow protocol the runner drives, whatever engine answers it.

The runner brings up a cell's engine once (``CellEngine``), opens a session per workload and in it
a system (``SystemUnderTest``) per pass group from the cell's levels, serves it one pass of requests at a time
(token-id prompts, greedy, top-2 logprobs), reads per request the tokens, logprobs and top-2
margin, per-tier cached tokens and finish reason (``reference_impl.request.RequestOutput``), and
per pass the engine's decode counters; it asks for the idle engine's audit after each pass and
closes it at the end. Everything that crosses the protocol is a plain value (dataclasses of lists,
ints, floats and strings), so an engine in another process and another interpreter answers it
over a pipe as well as the reference engine does in the cell's own process.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import torch

from fixtures.spec_expect import Proposer
from fixtures.workloads import CachedExpectation, Workload
from harness.sut.inputs import InputsCheck
from harness.sut.levels import EngineLevels
from reference_impl.request import RequestOutput, RequestSpec

if TYPE_CHECKING:
    from fixtures.workloads.boundary import Seams


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecTraits:
    """The proposer as the engine applied it."""

    method: str = "none"        # the spec level ("none": no speculative decoding)
    k: int = 0                  # draft tokens per verify step
    pass_counted: bool = False  # speculative counters per pass only (drafts, accepted), not per request
    replay: Proposer | None = None  # the rule the proposer drafts by, where known: its counters replayed
    whole_drafts: bool = True   # every verify step carries the whole draft; False where a step's token budget may cut
    #                             one (then the accept length is the scheduler's as much as the proposer's)
    replay_hits: bool = True    # a pass with prefix-cache hits is replayed; False where the proposer's state over a
    #                             matched block is by design not the request's (vLLM keeping an EAGLE head's last block)

    @property
    def max_accept_length(self) -> int:
        """k + 1: the most tokens one verify step can emit (the bonus token included)."""
        return self.k + 1


class CacheRule(Protocol):
    """How an engine's prefix cache grants hits (``harness.sut.rules``): the cached tokens each request of one pass
    should get. An object, so that it travels with the traits to a worker process and into a golden run."""

    #: one line naming the rule and where it is written down (a finding carries it)
    name: str

    def expected(self, workload: Workload, traits: Traits, name: str,
                 passes: Mapping[str, PassResult]) -> dict[str, CachedExpectation]:
        """rid → the cached tokens allowed in pass ``name`` (``passes`` holds every pass the system served)."""
        ...


@dataclass(frozen=True, slots=True)
class Applied:
    """One setting as the cell asked for it and as the engine reports it applied (``used``); ``defeats`` says why
    the difference defeats what the cell tests ("" when it does not, or when they agree); ``rule`` cites the engine's
    own documented rule that made the change, where one did (then the cell is judged by what it applied)."""

    what: str
    asked: object
    used: object
    defeats: str = ""
    rule: str = ""

    @property
    def changed(self) -> bool:
        return self.asked != self.used

    def describe(self) -> str:
        """``slots: asked 4, engine used 1`` (and the engine's rule, where one made the change)."""
        text = f"{self.what}: asked {self.asked}, engine used {self.used}"
        return f"{text} ({self.rule})" if self.rule and self.changed else text


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheTraits:
    """The prefix cache as the engine applied it: what its hits are judged by."""

    enabled: bool
    page_size: int               # tokens per KV page (block)
    chunk_size: int              # the Mamba2 SSD chunk, which with the page size sets the snapshot grid
    state_interval: int          # tokens between the hybrid model's cached state snapshots
    tiers: tuple[str, ...] = ()  # the cache's tiers below L1 ("host", "storage")
    rule: CacheRule | None = None  # how it grants hits, the engine's own rule; None: the shared paged prefix cache's


@dataclass(frozen=True, slots=True, kw_only=True)
class Traits:
    """What the oracles must know of an opened system to judge it: the levels as the engine applied them."""

    dtype: torch.dtype
    model: str                 # the model level (names the accept band)
    hybrid: bool
    deterministic: bool
    spec: SpecTraits
    cache: CacheTraits
    aborts_allowed: bool = False  # PD cells that inject transport failures may end requests "aborted"
    audited: bool = True          # the idle engine audits its pools (pool_audit judges it); a real engine does not
    pd: bool = False  # a prefill engine and a decode server: the client's hit is the prefill side's, which never decodes
    applied: tuple[Applied, ...] = ()  # settings read back from the engine, beside what the cell asked (none: not read)
    pressed: bool = False  # sized to run short of KV memory: the engine's counters must show preemptions


@dataclass(slots=True, kw_only=True)
class PassResult:
    """One pass as the system served it: the outputs, NaN events it saw, its idle audit, its decode counters."""

    outputs: list[RequestOutput]
    nan_events: list = field(default_factory=list)
    audit: list[str] = field(default_factory=list)     # idle-engine integrity problems; empty when sound
    counters: dict[str, int] = field(default_factory=dict)  # decode counters over this pass alone
    pd: dict | None = None  # PD engines: the pass's ledger (reference_impl.pd.ledger.PassLedger.to_json()); else None
    # where the engine says (llama.cpp's replies do): rid → the slot that served it (id_slot), and rid → the steps of
    # its reply a verify step emitted
    placement: dict[str, int] = field(default_factory=dict)
    verified: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # what the caller handed the engine's APIs in this pass, compared before and after each call (``harness.sut.inputs``)
    inputs: list[InputsCheck] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Totals:
    """What a system counted over its whole life: engine counters, and what crossed between PD engines."""

    stats: dict[str, int]
    pd: dict | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # a real engine's own timings: start, requests
    logs: list[str] = field(default_factory=list)  # a server's output files, kept for the report


class SystemUnderTest(Protocol):
    """One engine built from a cell's levels. ``serve`` runs a pass's rounds one after the other (a round's
    requests are submitted together); it may be called several times (cold, warm), and the engine keeps its
    cache between calls. Closing releases every process, file and connection it holds."""

    traits: Traits

    def serve(self, rounds: Sequence[Sequence[RequestSpec]]) -> PassResult: ...

    def totals(self) -> Totals: ...

    def close(self) -> None: ...


class Session(Protocol):
    """The systems of one cell and one workload, opened from one configuration and closed together.

    Systems of one session share its store: ``tenant_suffix`` opens a second tenant on it (that must hit
    nothing) and an empty suffix a second instance of the cell's tenant (that must hit what the store
    holds); ``alone`` opens a plain engine (no PD) that runs one request at a time, in a namespace of its
    own: the reference that batch invariance compares with.
    """

    def open(self, *, tenant_suffix: str = "", alone: bool = False) -> SystemUnderTest: ...

    def close(self) -> None: ...


class CellEngine(Protocol):
    """The engine of one cell, brought up once for all its workloads (for a real engine: one child process)
    and closed when the cell ends, whatever happened; each workload opens a session on it."""

    def session(self, workload: Workload) -> Session: ...

    def close(self) -> None: ...


#: how a cell opens an engine: the cell's levels, the faults to inject, the device and the engine's arguments (what
#: ``Engine.parse_tables`` made of the matrix file's own tables).
OpenEngine = Callable[[Mapping[str, object], frozenset[str], str, Mapping[str, object]], CellEngine]
#: a matrix file's tables (all of it), its factors and its ``[golden]`` table → the engine's arguments.
ParseTables = Callable[[Mapping[str, object], Mapping[str, tuple[object, ...]], Mapping[str, object]], Mapping[str, object]]


def no_tables(doc: Mapping[str, object], factors: Mapping[str, tuple[object, ...]],
              golden: Mapping[str, object]) -> Mapping[str, object]:
    """An engine that reads no table of its own: no arguments."""
    return MappingProxyType({})


def no_launch_problem(engine_args: Mapping[str, object]) -> str | None:
    """An engine with nothing to launch: nothing can be missing."""
    return None


def no_version(engine_args: Mapping[str, object]) -> str | None:
    """An engine that cannot say which version of itself a run drives (the harness's commit covers the reference)."""
    return None


def no_build(engine_args: Mapping[str, object]) -> dict[str, str]:
    """An engine with no build of its own to describe (the reference's is the harness's commit)."""
    return {}


def no_program(engine_args: Mapping[str, object]) -> str | None:
    """An engine whose cells run the engine itself."""
    return None


def no_cpu_needs(engine_args: Mapping[str, object]) -> Mapping[str, Mapping[str, frozenset[str]]]:
    """An engine none of whose levels chooses a kernel path by the CPU's flags."""
    return {}


def no_seams(levels: Mapping[str, object], engine_args: Mapping[str, object]) -> Seams | None:
    """An engine that cannot say where its cells' boundaries lie: the boundary family does not draw for it."""
    return None


def no_made_model(levels: Mapping[str, object], engine_args: Mapping[str, object]) -> str | None:
    """An engine whose cells serve no model made here: no other engine computes the same function."""
    return None


def computes_none(made_model: str) -> dict[str, object] | None:
    """An engine that computes none of the models made here as another engine's reference."""
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """One engine a matrix can put under test, declared once in its package (``ENGINE``) and named in
    ``harness.sut.BUILTIN``: its levels, how a cell opens it, and what a run asks of it. Nothing outside its
    package names it."""

    levels: EngineLevels
    open: OpenEngine
    #: it runs in the cell's own process: ``-j`` fills the cores by default and golden runs are made per workload;
    #: otherwise cells run one at a time unless ``-j`` says otherwise, and a golden configuration starts once
    in_process: bool = False
    #: the matrix file's tables it reads (``engine_args``, ``server``); ``parse_tables`` validates them
    tables: tuple[str, ...] = ()
    parse_tables: ParseTables = no_tables
    #: why the program it launches is not here (not built, not installed), found when the matrix is loaded
    launch_problem: Callable[[Mapping[str, object]], str | None] = no_launch_problem
    #: the model made here (``levels.MADE_MODELS``) whose weights a cell (full levels, engine arguments) serves as
    #: they were made, None where it serves other weights: another engine that ``computes`` it is the cross_engine
    #: oracle's reference (``harness.sut.cross_golden``)
    made_model: Callable[[Mapping[str, object], Mapping[str, object]], str | None] = no_made_model
    #: the golden levels with which it computes a made model's function, None for one it does not
    computes: Callable[[str], dict[str, object] | None] = computes_none
    #: the version of what it drives, read without starting it (the run header records it; ``--resume`` refuses
    #: to mix rows of two versions)
    version: Callable[[Mapping[str, object]], str | None] = no_version
    #: what its build says of itself, read cheaply without serving (no engine start): name → value, e.g. llama.cpp's
    #: commit, compiler and the CPU features ggml compiled; the run header's host record keeps it beside ``version``
    build: Callable[[Mapping[str, object]], dict[str, str]] = no_build
    #: the program its cells run, by name, where that is not the engine itself (a server: its wire format)
    program: Callable[[Mapping[str, object]], str | None] = no_program
    #: factor → level → the CPU flags that level's kernel path needs (a host without them refuses the matrix at load)
    needs_cpu: Callable[[Mapping[str, object]], Mapping[str, Mapping[str, frozenset[str]]]] = no_cpu_needs
    #: a cell's seams from its full levels and engine arguments (page, prefill budget, draft tokens, context,
    #: vocabulary), as the engine applies them: where the boundary family draws (``fixtures/workloads/boundary.py``)
    seams: Callable[[Mapping[str, object], Mapping[str, object]], Seams | None] = no_seams
    #: the reproducer script writers of the programs its cells run (``program_name``) → each one's import path,
    #: ``module:ATTRIBUTE`` (a ``harness.sut.script.writer.ScriptWriter``), imported when a script is written
    writers: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.levels.name

    def program_name(self, engine_args: Mapping[str, object]) -> str:
        """What a cell with ``engine_args`` runs: a reproducer's writer and a finding's name go by it."""
        return self.program(engine_args) or self.name
