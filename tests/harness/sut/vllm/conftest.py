"""What the real-vLLM tests of this package share: one set of golden runs (their xdist group runs on one worker)."""
from __future__ import annotations

import pytest

from harness.run.golden import GoldenRuns


@pytest.fixture(scope="session")
def goldens() -> GoldenRuns:
    """vLLM's golden of the dense model per workload, and the reference's: computed once for every module here (a
    PD cell's golden is a single engine's, the same run a plain cell of that workload is judged by)."""
    return GoldenRuns()
