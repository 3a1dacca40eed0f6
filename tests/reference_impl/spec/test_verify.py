"""Speculative decoding: lossless greedy verification, accept-length accounting, draft state and its pools (the n-gram
proposer alone: test_ngram.py; the pools' leak check: tests/reference_impl/memory/test_engine_pools.py)."""
from __future__ import annotations

import pytest

from fixtures.workloads import load_workload
from reference_impl.config import DENSE
from reference_impl.spec.draft_model import draft_config
from reference_impl.spec.verify import accept_stats, greedy_accept, outputs_accept_stats

DEFAULT_WORKLOADS = ("system_prompt", "multi_turn", "long_prompts", "burst")


def test_greedy_accept_stops_at_the_first_mismatch() -> None:
    assert greedy_accept([1, 2, 3], [1, 2, 3, 9]) == 3
    assert greedy_accept([1, 5, 3], [1, 2, 3, 9]) == 1
    assert greedy_accept([], [7]) == 0


def test_accept_stats_count_the_bonus_and_skip_plain_decodes() -> None:
    stats = accept_stats(accepted=[3, 0, 1, 0], drafted=[3, 3, 2, 0])
    assert stats.steps == 3 and stats.emitted == 4 + 1 + 2
    assert stats.mean_accept_length == pytest.approx(7 / 3)
    assert stats.acceptance_rate == pytest.approx(4 / 8)
    assert stats.histogram == {4: 1, 1: 1, 2: 1}
    assert stats.per_position == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert accept_stats([0], [0]).mean_accept_length is None


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("spec", ["ngram", "draft", "mtp"])
@pytest.mark.parametrize("levels", [{}, {"cache": "device", "page_size": 16, "pool": "unified"}])
def test_spec_tokens_and_logits_are_bitwise_the_plain_ones(make_engine, model: str, spec: str, levels: dict) -> None:
    wl = load_workload("system_prompt")
    plain = {o.rid: o for o in make_engine(wl, model=model).generate(wl.requests)}
    engine = make_engine(wl, model=model, spec=spec, **levels)
    for _ in range(2):  # cold, then warm
        for out in engine.generate(wl.requests):
            want = plain[out.rid]
            assert (out.tokens, out.logprobs, out.margins) == (want.tokens, want.logprobs, want.margins)
            assert len(out.accepted) == len(out.drafted) and all(a <= d for a, d in zip(out.accepted, out.drafted))
    assert engine.audit() == []


@pytest.mark.parametrize("model", ["dense", "hybrid"])
@pytest.mark.parametrize("spec", ["draft", "mtp"])
def test_draft_and_mtp_accept_length_is_neither_useless_nor_perfect(make_engine, model: str, spec: str) -> None:
    outputs = []
    for name in DEFAULT_WORKLOADS:
        wl = load_workload(name)
        outputs += make_engine(wl, model=model, spec=spec).generate(wl.requests)
    stats = outputs_accept_stats(outputs)
    assert 1.5 <= stats.mean_accept_length <= 3 + 0.5
    assert 0 < stats.per_position[-1] < 1  # some steps reject, some accept everything


def test_hybrid_partial_accepts_roll_the_mamba_state_back(make_engine) -> None:
    """Partial accepts happen on the hybrid model, and the bitwise test above covers their rollback."""
    wl = load_workload("multi_turn")
    outs = make_engine(wl, model="hybrid", spec="draft").generate(wl.requests)
    assert any(0 < a < d for o in outs for a, d in zip(o.accepted, o.drafted))


def test_draft_pool_is_sized_from_the_draft_geometry(make_engine) -> None:
    engine = make_engine("pair", spec="draft")
    draft = draft_config(DENSE)
    k_view, _ = engine.pools.draft.kv_views(0)
    assert (draft.num_kv_heads, draft.head_dim) != (DENSE.num_kv_heads, DENSE.head_dim)
    assert tuple(k_view.shape[-2:]) == (draft.num_kv_heads, draft.head_dim)
    assert engine.pools.draft.num_free_pages == engine.config.num_pages


def test_mtp_kv_is_a_tail_layer_of_the_target_pool(make_engine) -> None:
    engine = make_engine("pair", spec="mtp", model="hybrid")
    tail = len(engine.config.model.attention_layers)
    assert engine.proposer.kv_pool is engine.pools.target and engine.proposer.kv_layer == tail
    assert engine.pools.draft is None
    engine.pools.kv_views(tail)  # exists
    with pytest.raises(IndexError):
        engine.pools.kv_views(tail + 1)


@pytest.mark.parametrize("spec", ["draft", "mtp"])
def test_losing_the_draft_state_on_hits_collapses_warm_accept_length(make_engine, spec: str) -> None:
    wl = load_workload("system_prompt")
    means = {}
    for faults in (frozenset(), frozenset({"draft_state_not_cached"})):
        engine = make_engine(wl, faults, spec=spec, cache="device", page_size=16)
        cold = engine.generate(wl.requests)
        warm = engine.generate(wl.requests)
        means[bool(faults)] = outputs_accept_stats(warm).mean_accept_length
        plain_tokens = {o.rid: o.tokens for o in cold}
        assert all(o.tokens == plain_tokens[o.rid] for o in warm)
        hits = (engine.stats.draft_full_hits, engine.stats.draft_partial_hits)
        assert (hits[0] == 0) == bool(faults) and (hits[1] > 0) == bool(faults)
    assert means[True] <= 0.75 * means[False]


def test_mtp_layer_index_oob_fails_at_load(make_engine) -> None:
    assert DENSE.layer_kind(DENSE.num_layers) == "attention"
    make_engine("pair", spec="mtp")
    with pytest.raises(IndexError):
        make_engine("pair", frozenset({"mtp_layer_index_oob"}), spec="mtp")
    make_engine("pair", frozenset({"mtp_layer_index_oob"}), spec="draft")  # no layer past the table


def test_rejected_draft_pages_are_freed_at_once(make_engine) -> None:
    """Every page beyond the computed tokens goes back right after the verify step."""
    wl = load_workload("multi_turn")
    engine = make_engine(wl, spec="draft", page_size=1)
    original = engine._settle_verify

    def settle_and_check(chunks, before):
        original(chunks, before)
        for chunk in chunks:
            assert len(chunk.req.pages) == chunk.req.num_computed

    engine._settle_verify = settle_and_check
    engine.generate(wl.requests)
    assert engine.audit() == []


def test_spec_is_a_factor_whose_golden_is_none() -> None:
    from harness.sut.reference import LEVELS
    from harness.run.plan import spec_golden_levels
    from reference_impl import registry

    assert set(registry.COMPONENTS["spec"]) == {"none", "ngram", "draft", "mtp"}
    assert registry.resolve("num_draft_tokens", 2) == 2
    assert LEVELS.defaults["spec"] == LEVELS.golden["spec"] == "none"
    golden = {"cache": "off", "page_size": 1}
    assert spec_golden_levels({"spec": "none", "cache": "device"}, golden) is None
    assert spec_golden_levels({"spec": "mtp", "num_draft_tokens": 2, "cache": "device"}, golden) == {
        "cache": "off", "page_size": 1, "spec": "mtp", "num_draft_tokens": 2}


def test_cell_metrics_report_accept_length_and_draft_state_hits(tmp_path) -> None:
    from harness.matrix.model import generate
    from harness.matrix.file import load_matrix
    from harness.run.golden import GoldenRuns
    from harness.run.cell import run_cell

    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nname = "m"\nmode = "full"\nworkloads = ["system_prompt"]\n'
                    '[factors]\nspec = ["draft"]\ncache = ["device"]\npage_size = [16]\n')
    spec = load_matrix(str(path))
    (cell,) = generate(spec)
    for faults, full in ((frozenset(), True), (frozenset({"draft_state_not_cached"}), False)):
        result = run_cell(spec, cell, faults=faults, goldens=GoldenRuns())
        metrics = result.metrics
        if full:
            assert 1.5 <= metrics["mean_accept_length"] <= 3.5
        assert (metrics["draft_full_hits"] > 0, metrics["draft_partial_hits"] > 0) == (full, not full)
        assert result.oracles["accept_length"].status == ("pass" if full else "fail")


def test_engine_asserts_emitted_equals_accepted_plus_one(make_engine, monkeypatch) -> None:
    from reference_impl.engine.model_runner import ModelRunner

    original = ModelRunner._verify

    def miscount(self, chunks, batch, hidden):
        original(self, chunks, batch, hidden)
        chunks[0].req.output.accepted[-1] += 1  # an accounting bug: one more accepted than emitted

    monkeypatch.setattr(ModelRunner, "_verify", miscount)
    wl = load_workload("pair")
    with pytest.raises(AssertionError, match="emitted"):
        make_engine(wl, spec="draft").generate(wl.requests)
