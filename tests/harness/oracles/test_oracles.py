"""Every oracle passes on identical results (``judge`` over the registered oracles), and the passes the oracles' tests
build from plain values (``output``, ``view``, ``baseline``). Each oracle fails on a crafted discrepancy, naming it,
in its own module's test (``test_tokens.py``, ``test_accept_length.py``, ...); declared known failures in
``test_view.py``."""
from __future__ import annotations

import copy

import torch

from fixtures.spec_expect import Proposer
from fixtures.workloads import CachedExpectation
from harness.oracles import judge, oracles
from harness.oracles.view import KnownFailure, PassView
from harness.sut.base import Applied, CacheTraits, PassResult, SpecTraits, Traits
from harness.sut.inputs import InputsCheck
from reference_impl.request import RequestOutput, RequestSpec

ORACLES = oracles()


def output(rid: str, tokens: list[int], margin: float = 1.0, cached: int = 0) -> RequestOutput:
    n = len(tokens)
    out = RequestOutput(
        rid=rid, tokens=list(tokens), logprobs=[-0.5] * n, top_ids=[[t] for t in tokens], top_logprobs=[[-0.5]] * n,
        margins=[margin] * n, cached_tokens=cached, finish_reason="length",
    )
    out.cached_device = cached  # from L1 unless a test moves it to a lower tier
    return out


def view(outputs: list[RequestOutput], golden: list[RequestOutput] | None = None, *, workload: str = "w",
         name: str = "warm", requested: dict[str, int] | None = None, prompts: dict[str, tuple[int, ...]] | None = None,
         expected_cached: dict | None = None, nan_events: list | None = None, audit: list[str] | None = None,
         counters: dict[str, int] | None = None, pd_ledger: dict | None = None, dtype: torch.dtype = torch.float32,
         deterministic: bool = False, hybrid: bool = False, audited: bool = True, aborts_allowed: bool = False,
         spec: str = "none", max_accept_length: int = 4, pass_counted: bool = False, page_size: int = 1,
         reference: list[RequestOutput] | None = None, spec_reference: list[RequestOutput] | None = None,
         spec_reference_counters: dict[str, int] | None = None, cross_reference: list[RequestOutput] | None = None,
         tolerances: dict[str, float] | None = None, accept_band: tuple[float, float] | None = None,
         known: tuple[KnownFailure, ...] = (), applied: tuple[Applied, ...] = (),
         verified: dict[str, tuple[int, ...]] | None = None, replay: Proposer | None = None,
         pressed: bool = False, whole_drafts: bool = True, replay_hits: bool = True,
         inputs: list[InputsCheck] | None = None) -> PassView:
    """One pass as an oracle sees it, built from plain values: what each test changes is named, the rest is a
    sound pass of ``outputs`` against a ``golden`` equal to it. ``reference`` is what batch invariance holds the pass
    to: each request alone for the cold pass, the cold pass for a later one."""
    golden = golden if golden is not None else copy.deepcopy(outputs)
    requested = requested if requested is not None else {o.rid: len(o.tokens) for o in golden}
    prompts = prompts or {}
    references = {"golden": PassResult(outputs=golden)}
    if reference is not None:
        references["solo" if name == "cold" else "cold"] = PassResult(outputs=reference)
    if spec_reference is not None:
        references["spec_golden"] = PassResult(outputs=spec_reference, counters=spec_reference_counters or {})
    if cross_reference is not None:
        references["cross_engine"] = PassResult(outputs=cross_reference)
    traits = Traits(dtype=dtype, model="m", hybrid=hybrid, deterministic=deterministic,
                    spec=SpecTraits(method=spec, k=max_accept_length - 1, pass_counted=pass_counted,
                                    replay=replay, whole_drafts=whole_drafts, replay_hits=replay_hits),
                    cache=CacheTraits(enabled=True, page_size=page_size, chunk_size=page_size, state_interval=page_size),
                    aborts_allowed=aborts_allowed, audited=audited, applied=applied, pressed=pressed)
    got = PassResult(outputs=outputs, nan_events=nan_events or [], audit=audit or [], counters=counters or {},
                     pd=pd_ledger, verified=verified or {}, inputs=inputs or [])
    return PassView(
        workload=workload, name=name, got=got, traits=traits, references=references,
        requests=tuple(RequestSpec(rid, prompts.get(rid, ()), n) for rid, n in requested.items()),
        expected_cached=expected_cached if expected_cached is not None else
        {o.rid: CachedExpectation(o.cached_tokens, o.cached_tokens, 1) for o in golden},
        tolerances=tolerances or {}, accept_band=accept_band, known=known)


def baseline() -> list[RequestOutput]:
    return [output("a", [1, 2, 3, 4], cached=8), output("b", [5, 6, 7, 8], cached=0)]


#: a PD pass whose two requests landed as their prompts and hits say (pd_audit armed)
LEDGER = {"attempts": [{"rid": "a", "attempt": 0, "prompt_tokens": 12, "decode_hit_pages": 1, "pages_sent": 2,
                        "outcome": "success", "prefill_hit": (8, 0, 0), "prefill_held_after": False, "decode_live_after": ()},
                       {"rid": "b", "attempt": 0, "prompt_tokens": 4, "decode_hit_pages": 0, "pages_sent": 1,
                        "outcome": "success", "prefill_hit": (0, 0, 0), "prefill_held_after": False, "decode_live_after": ()}],
          "decode": {"staging_reserved": 0, "staging_released": 0, "aux_taken": 2, "aux_returned": 2},
          "verify_scratch_bytes": {"prefill": 0, "decode": 0}}


def test_every_oracle_passes_on_identical_results() -> None:
    verdicts = judge([view(baseline(), deterministic=True, reference=baseline(),
                           spec_reference=baseline(), max_accept_length=4, page_size=4, pd_ledger=LEDGER,
                           prompts={"a": tuple(range(12)), "b": (1, 2, 3, 4)}, name="cold",
                           cross_reference=baseline(), applied=(Applied("slots", 4, 4),), pressed=True,
                           counters={"preemptions": 1}, inputs=[InputsCheck(call="serve", where="here", compared=2)])])
    assert {name: v.status for name, v in verdicts.items()} == {name: "pass" for name in ORACLES}
