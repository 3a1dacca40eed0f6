"""pool_audit: any problem the engine's own audit reports fails; an engine that audits nothing skips."""
from __future__ import annotations

from tests.harness.oracles.test_oracles import ORACLES, baseline, view


def test_pool_audit_fails_on_any_problem() -> None:
    v = ORACLES["pool_audit"]([view(baseline(), audit=["pages leaked: free 3 + cached 4 != 8"])])
    assert v.status == "fail" and "leaked" in v.message


def test_pool_audit_skips_an_engine_that_reports_none() -> None:
    assert ORACLES["pool_audit"]([view(baseline(), audited=False)]).status == "skip"
