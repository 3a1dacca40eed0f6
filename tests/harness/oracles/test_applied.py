"""applied: a setting the engine changed fails only where the change defeats the cell; nothing read back: skip."""
from __future__ import annotations

from harness.sut.base import Applied
from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_applied_fails_only_on_a_change_that_defeats_the_cell() -> None:
    assert ORACLES["applied"]([view(baseline())]).status == "skip"  # nothing read back
    harmless = Applied("kv_unified", False, True)
    v = ORACLES["applied"]([view(baseline(), applied=(Applied("slots", 4, 4), harmless))])
    assert v.status == "pass" and "kv_unified: asked False, engine used True" in v.message
    dropped = Applied("speculative", True, False, "the cell tests speculative decoding and the server runs without it")
    v = ORACLES["applied"]([view(baseline(), applied=(harmless, dropped))])
    assert v.status == "fail" and v.detail == [{"setting": "speculative", "expected": True, "got": False,
                                                "defeats": dropped.defeats}]
