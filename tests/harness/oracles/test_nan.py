"""nan: a NaN sentinel event or a NaN logprob fails, naming where it showed."""
from __future__ import annotations

from reference_impl.engine.model_runner import NanEvent
from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_nan_fails_on_sentinel_event_and_on_nan_logprob() -> None:
    event = NanEvent("attention[0]", 3, ["a"])
    assert ORACLES["nan"]([view(baseline(), nan_events=[event])]).detail[0]["where"] == "attention[0]"
    outs = baseline()
    outs[1].logprobs[0] = float("nan")
    assert ORACLES["nan"]([view(outs, baseline())]).detail[0]["request"] == "b"
