"""The independent cache model predicts every hit of a sequential workload exactly, per tier, under pressure,
and the cached_tokens oracle then compares equal where it used to accept a band."""
from __future__ import annotations

import random

import pytest

from fixtures.workloads import Workload, load_workload, tokens
from fixtures.workloads.cache_model import ModelError, model_hits
from harness.sut.reference import LEVELS
from harness.run.serve import run_workload
from harness.sut.reference.engine import build_engine_config
from reference_impl.engine.llm_engine import Engine
from reference_impl.request import RequestSpec

HIT = dict(state_interval=32, chunk_size=16, hybrid=False)


def random_sequential(seed: int) -> Workload:
    """Requests on three shared heads (or none), served one at a time, in a small L1 over a small L2."""
    rng = random.Random(seed)
    heads = [tokens(rng, rng.choice([16, 32, 48])) for _ in range(3)]
    requests = []
    for i in range(rng.randint(5, 9)):
        prompt = (rng.choice(heads) if rng.random() < 0.7 else ()) + tokens(rng, rng.randint(2, 70))
        requests.append(RequestSpec(f"r{i}", prompt, max_new_tokens=rng.randint(1, 20)))
    return Workload(f"random{seed}", "", tuple(requests), capacity_tokens=rng.choice([160, 192, 256]),
                    host_capacity_tokens=rng.choice([48, 64, 128, 208]), round_sizes=(1,) * len(requests))


def engine_hits(workload: Workload, page_size: int, cache: str) -> tuple[list[dict], tuple[str, ...], int, int]:
    """Both passes of ``workload`` on one engine: each request's (total, host, storage), and what L1 and L2 evicted."""
    engine = Engine(build_engine_config({"page_size": page_size, "cache": cache}, workload, frozenset()))
    passes = [{o.rid: (o.cached_tokens, o.cached_host, o.cached_storage) for g in workload.rounds()
               for o in engine.generate(g)} for _ in range(2)]
    return passes, tuple(engine.cache.lower_tiers), engine.cache.evicted_pages, getattr(engine.cache, "host", None) and engine.cache.host.evicted


@pytest.mark.parametrize("cache", ["device", "host", "storage"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["random1", "random5", "random14", "random16", "random26", "leaf_pressure", "demoted_head"])
def test_the_model_predicts_every_hit_of_the_engine(name: str, page_size: int, cache: str) -> None:
    workload = random_sequential(int(name[6:])) if name.startswith("random") else load_workload(name)
    got, tiers, l1_evicted, _ = engine_hits(workload, page_size, cache)
    want = model_hits(workload.rounds(), page_size=page_size, num_pages=workload.num_pages(page_size),
                      host_pages=workload.host_pages(page_size), tiers=tiers, passes=2)
    assert l1_evicted > 0, "no pressure: the model would only be checked where the band is exact anyway"
    assert got == want


def test_random_workloads_reach_every_tier_under_pressure() -> None:
    """Across the random workloads the model is checked with L2 dropping copies and hits from host and storage."""
    seen = {"host": 0, "storage": 0, "l2_evicted": 0}
    for seed in (1, 5, 14, 26):
        for cache in ("host", "storage"):
            passes, _, _, l2_evicted = engine_hits(random_sequential(seed), 16, cache)
            seen["l2_evicted"] += l2_evicted
            for hits in passes:
                seen["host"] += sum(h for _, h, _ in hits.values())
                seen["storage"] += sum(s for _, _, s in hits.values())
    assert all(seen.values()), seen


def test_a_capped_sequential_pass_is_exact_not_a_band() -> None:
    workload = load_workload("leaf_pressure")
    band = workload.expected_cached(page_size=16, warm=False, **HIT)["leaf-again"]
    exact = workload.expected_cached(page_size=16, warm=False, exact=True, **HIT)["leaf-again"]
    assert (band.lo, band.hi) == (0, 32)
    assert (exact.lo, exact.hi, exact.host, exact.storage) == (32, 32, 0, 0)


def test_an_eviction_that_frees_too_much_fails_only_against_the_model() -> None:
    """evict_counts_leaves: the lost hit is inside the band, and outside the model's exact expectation."""
    levels = {**LEVELS.defaults, "cache": "device", "page_size": 16}
    run = run_workload(levels, load_workload("leaf_pressure"), frozenset({"evict_counts_leaves"}), "cpu")
    (out,) = [o for o in run.passes["cold"].outputs if o.rid == "leaf-again"]
    workload = load_workload("leaf_pressure")
    assert workload.expected_cached(page_size=16, warm=False, **HIT)["leaf-again"].admits(out.cached_tokens)
    assert not workload.expected_cached(page_size=16, warm=False, exact=True, **HIT)["leaf-again"].admits(out.cached_tokens)


def test_the_model_refuses_what_it_does_not_model() -> None:
    with pytest.raises(ModelError, match="one at a time"):
        model_hits(load_workload("burst").rounds(), page_size=16, num_pages=16, host_pages=32, tiers=(), passes=1)
    # a batched workload keeps its band even when asked for the exact expectation
    burst = load_workload("burst").expected_cached(page_size=16, warm=True, exact=True, **HIT)
    assert any(e.lo < e.hi for e in burst.values())


@pytest.mark.parametrize("cache", ["device", "host", "storage"])
@pytest.mark.parametrize("name", ["random14", "leaf_pressure"])
def test_the_model_predicts_a_pd_prefill_side_too(name: str, cache: str) -> None:
    """PD: the client's hit is the prefill side's, whose requests never decode there (``decodes=False``)."""
    from dataclasses import replace

    from reference_impl.pd.disagg import DisaggEngine
    from reference_impl.pd.inproc.conn import InprocTransport

    workload = random_sequential(14) if name == "random14" else load_workload(name)
    config = build_engine_config({"page_size": 16, "cache": cache, "prefill_budget": 32}, workload, frozenset())
    pd = DisaggEngine(replace(config, pd=InprocTransport))
    got = [{o.rid: (o.cached_tokens, o.cached_host, o.cached_storage) for g in workload.rounds()
            for o in pd.generate(g)} for _ in range(2)]
    assert got == model_hits(workload.rounds(), page_size=16, num_pages=workload.num_pages(16),
                             host_pages=workload.host_pages(16), tiers=tuple(pd.cache.lower_tiers), passes=2,
                             decodes=False)
