"""The reference engine's side of a reproducer script: serve the rounds cold then warm on one engine built from an
``EngineConfig``, and hand back what came out as plain values (``checks``' run). Imports ``reference_impl`` alone."""
from __future__ import annotations

import uuid
from dataclasses import replace

from reference_impl.config import EngineConfig
from reference_impl.engine.llm_engine import Engine
from reference_impl.request import RequestOutput, RequestSpec


def plain(out: RequestOutput) -> dict:
    """One ``RequestOutput`` as the checks read it."""
    return {"rid": out.rid, "tokens": list(out.tokens), "logprobs": list(out.logprobs), "margins": list(out.margins),
            "cached_tokens": out.cached_tokens, "cached_host": out.cached_host, "cached_storage": out.cached_storage,
            "finish_reason": out.finish_reason, "accepted": list(out.accepted), "drafted": list(out.drafted)}


def serve(config: EngineConfig, rounds: list[list[tuple]]) -> dict:
    """A cold pass then a warm pass of ``rounds`` (each a list of ``(rid, prompt, max_new_tokens, priority)``, served
    one after the other) on one engine; a store namespace of its own, so no earlier run's pages are hit."""
    run = {"raised": None, "passes": {}}
    engine = None
    try:
        config = replace(config, tenant=f"repro-{uuid.uuid4().hex}")
        if config.pd is not None:  # prefill and decode engines behind the cell's KV transport
            from reference_impl.pd.disagg import DisaggEngine
            engine = DisaggEngine(config)
        else:
            engine = Engine(config)
        for name in ("cold", "warm"):
            seen = len(engine.nan_events)
            outputs = [out for group in rounds for out in engine.generate([RequestSpec(*r) for r in group])]
            run["passes"][name] = {"outputs": [plain(o) for o in outputs], "audit": list(engine.audit()),
                                   "nan_events": len(engine.nan_events) - seen}
    except Exception as exc:  # the failure may be this very exception
        run["raised"] = f"{type(exc).__name__}: {exc}"
    finally:
        if engine is not None:
            engine.close()
    return run
