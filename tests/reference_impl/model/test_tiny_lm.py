"""The tiny model: seeded, peaked (not near-uniform), prompt-dependent, and chunking-invariant."""
from __future__ import annotations

import math
import pytest
import torch

from fixtures.workloads import load_workload
from reference_impl.request import RequestSpec


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_greedy_continuations_are_varied_and_prompt_dependent(make_engine, model: str) -> None:
    wl = load_workload("long_prompts")
    outs = make_engine(wl, model=model).generate(wl.requests)
    continuations = [tuple(o.tokens) for o in outs]
    assert len(set(continuations)) == len(continuations), "different prompts gave the same continuation"
    for o in outs:
        assert len(set(o.tokens)) >= len(o.tokens) // 2, f"{o.rid} repeats itself: {o.tokens}"


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_logits_are_peaked_not_uniform(make_engine, model: str) -> None:
    wl = load_workload("system_prompt")
    outs = make_engine(wl, model=model).generate(wl.requests)
    top1 = [math.exp(lp[0]) for o in outs for lp in o.top_logprobs]
    uniform = 1 / 256
    assert sum(top1) / len(top1) > 20 * uniform, "the greedy token is barely above uniform"


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_same_seed_same_tokens_bitwise(make_engine, model: str) -> None:
    wl = load_workload("multi_turn")
    a = make_engine(wl, model=model).generate(wl.requests)
    b = make_engine(wl, model=model).generate(wl.requests)
    assert [(o.rid, o.tokens, o.logprobs) for o in a] == [(o.rid, o.tokens, o.logprobs) for o in b]


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_chunked_prefill_matches_one_shot(make_engine, model: str) -> None:
    """A prompt computed in 7-token chunks gives the tokens (and near logprobs) of one big prefill."""
    wl = load_workload("long_prompts")
    whole = make_engine(wl, model=model).generate(wl.requests)
    chunked = make_engine(wl, model=model, overrides={"prefill_budget": 7}).generate(wl.requests)
    by_rid = {o.rid: o for o in chunked}
    for o in whole:
        assert by_rid[o.rid].tokens == o.tokens
        torch.testing.assert_close(torch.tensor(by_rid[o.rid].logprobs), torch.tensor(o.logprobs), atol=1e-4, rtol=0)


def test_prompt_dependence_of_next_token(make_engine) -> None:
    """The same last token after different contexts does not always give the same next token."""
    specs = [RequestSpec(f"r{i}", (i, 17, i + 50, 3), max_new_tokens=1) for i in range(12)]
    outs = make_engine("system_prompt").generate(specs)
    assert len({o.tokens[0] for o in outs}) > 3


@pytest.mark.parametrize("model", ["dense", "reference_impl.config:DENSE32"])
def test_sequence_logits_is_the_served_function_unpaged(make_engine, model: str) -> None:
    """The unpaged forward that judges a proposer's drafts: its greedy argmax at every step of a served request is
    the engine's token, and its logprobs are the engine's; cut to one layer it is another function."""
    wl = load_workload("system_prompt")
    engine = make_engine(wl, model=model)
    outs = engine.generate(wl.requests)
    lm = engine.runner.model
    for spec, out in zip(wl.requests, outs):
        logits = lm.sequence_logits([*spec.prompt, *out.tokens])[len(spec.prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == list(out.tokens)
        torch.testing.assert_close(logits.log_softmax(-1).max(-1).values, torch.tensor(out.logprobs), atol=1e-4, rtol=0)
    spec, out = wl.requests[0], outs[0]
    cut = lm.sequence_logits([*spec.prompt, *out.tokens], layers=1)[len(spec.prompt) - 1 : -1]
    assert cut.argmax(-1).tolist() != list(out.tokens)
