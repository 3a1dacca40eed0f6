"""SGLang 0.5.23's server on CPU under engine = "openai", from .venv-sglang (make sglang-env): its smoke matrix runs
to the verdicts this host's declarations give, with no server left. On a CPU without AMX every cell serves: its golden
agrees token for token with the reference engine's on the exported dense model (cross_engine), and its radix cache
hits in the warm pass, judged exactly where the workload fixes the count. On a CPU with AMX SGLang serves no fp32
model, and every cell is that declared crash.

Not in make test nor CI (make test-sglang runs it): building the venv takes sgl-kernel's CPU target, compiled from an
SGLang checkout that no package registry serves (~7 CPU-minutes on 2 cores), and 3.5 GB. Without the venv it skips,
CI=true included.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.sut.host import cpu_flags
from tests.e2e.test_real_servers import agrees_with_the_reference, declared_here, smoke_rows

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.sglang, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"


def test_the_sglang_cpu_smoke_matrix_runs_to_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not SGLANG_PYTHON.exists():
        pytest.skip(f"no {SGLANG_PYTHON} (make sglang-env SGLANG_SRC=<an SGLang checkout>; not built in CI)")
    from tests.e2e import test_real_servers

    monkeypatch.setattr(test_real_servers, "SERVER_COMMANDS", ("sglang.launch_server", "sglang::"))
    rows = smoke_rows(tmp_path, "sglang_cpu_smoke")
    assert len(rows) == 3, rows.keys()
    # judged by the declarations of this host: on a CPU with AMX every fp32 cell dies at warm-up as declared
    declared = declared_here("sglang_cpu_smoke", rows)
    assert all(declared.values()) == ("amx_tile" in cpu_flags()), declared
    served = {cell: row for cell, row in rows.items() if not declared[cell]}
    if not served:
        return
    cached = [row for row in served.values() if row["factors"]["cache"] == "device"]
    assert cached and cached[0]["oracles"]["cached_tokens"]["verdict"] == "pass", cached
    assert cached[0]["metrics"]["cached_tokens_warm"] > 0, cached[0]["metrics"]
    for row in served.values():  # read back from /server_info: every setting the launch asks, as asked
        assert row["oracles"]["applied"]["verdict"] == "pass", row["oracles"]["applied"]
        assert row["metrics"]["applied"]["page_size"] == row["factors"]["page_size"], row["metrics"]
        assert row["metrics"]["applied_changes"] == [], row["metrics"]
    agrees_with_the_reference(served)
