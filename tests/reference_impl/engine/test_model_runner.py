"""The model runner's greedy choice (``ModelRunner._choosable``): a model's stop tokens (``ModelConfig.stop_tokens``)
are never chosen, as the engines under test never choose an end-of-generation token for a request of exactly
max_new_tokens; the logprobs stay the raw ones, as vLLM returns them."""
from __future__ import annotations

from dataclasses import replace

from reference_impl.config import DENSE
from reference_impl.request import RequestSpec

REQUEST = RequestSpec("r", (1, 2, 3, 4, 5, 6), max_new_tokens=4)


def test_a_stop_token_is_never_chosen_and_its_logprob_stays_raw(make_engine) -> None:
    (plain,) = make_engine().generate([REQUEST])
    stop = plain.tokens[0]
    (stopping,) = make_engine(overrides={"model": replace(DENSE, stop_tokens=(stop,))}).generate([REQUEST])
    assert stop not in stopping.tokens
    assert stopping.tokens[0] == plain.top_ids[0][1]  # the runner-up
    assert stopping.logprobs[0] == plain.top_logprobs[0][1]  # its raw logprob, the stop token's mass kept
    assert stopping.top_ids[0][0] == stop  # what the model put first is still shown
    assert stopping.margins[0] > 0 and stopping.margins[0] != plain.margins[0]  # between choosable tokens
