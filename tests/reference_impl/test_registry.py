"""Plug-in interfaces: every factor's built-in levels offer its Protocol, and a user class that does not is refused
when the matrix file is read, in one line naming the class and the member."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl import registry
from reference_impl.config import DENSE
from reference_impl.memory.engine_pools import EnginePools
from reference_impl.memory.static import StaticPools

ROOT = Path(__file__).resolve().parents[2]

MATRIX = """
[matrix]
name = "plugins"
mode = "full"
workloads = ["system_prompt"]

[factors]
model = ["dense"]
pool = ["static", "{pool}"]
page_size = [16]
"""


def harness_list(tmp_path: Path, pool: str) -> subprocess.CompletedProcess:
    """``python -m harness list --matrix`` on a matrix whose pool factor names ``pool`` besides static."""
    path = tmp_path / "plugins.toml"
    path.write_text(MATRIX.format(pool=pool))
    return subprocess.run([sys.executable, "-m", "harness", "list", "--matrix", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_user_pool_lacking_a_member_is_refused_in_one_line(tmp_path: Path) -> None:
    done = harness_list(tmp_path, "tests.components:BrokenPool")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "class BrokenPool lacks member 'free_pages' of Pool" in lines[0]
    assert "'tests.components:BrokenPool'" in lines[0] and "plugins.toml" in lines[0]


def test_a_correct_user_pool_passes_the_check(tmp_path: Path) -> None:
    registry.check_level("pool", "tests.components:CountingPool")
    done = harness_list(tmp_path, "tests.components:CountingPool")
    assert done.returncode == 0, done.stderr
    assert "pool:CountingPool" in done.stdout


def test_a_user_model_must_be_a_model_config() -> None:
    with pytest.raises(registry.InterfaceMismatchError, match="EngineConfig is not a ModelConfig"):
        registry.check_level("model", "reference_impl.config:EngineConfig")


def test_a_function_is_not_a_class() -> None:
    with pytest.raises(registry.InterfaceMismatchError, match="is not a class"):
        registry.check_level("scheduler", "reference_impl.faults:check_faults")


def test_every_component_factor_names_its_interface() -> None:
    assert set(registry.INTERFACES) == set(registry.COMPONENTS)


@pytest.mark.parametrize(("factor", "level"), [(f, level) for f in sorted(registry.COMPONENTS) for level in registry.COMPONENTS[f]])
def test_every_built_in_level_offers_its_interface(factor: str, level: str) -> None:
    impl = registry.resolve(factor, level)
    if impl is None:  # pd = off: no transport
        return
    registry.check_interface(factor, registry.COMPONENTS[factor][level], impl)


def test_engine_pools_offer_the_pool_interface() -> None:
    """The engine hands its EnginePools wherever a Pool goes (model runner, page mover, PD)."""
    registry.check_interface("pool", "reference_impl.memory.engine_pools:EnginePools", EnginePools)
    pools = EnginePools(StaticPools(DENSE, page_size=4, num_pages=8, num_state_slots=1))
    assert pools.pools == [pools.target] and pools.page_size == 4


def test_protocol_members_include_class_vars_properties_and_dunders() -> None:
    from reference_impl.engine.queue import SchedulerQueue
    from reference_impl.memory.pool import Pool
    from reference_impl.spec.proposer import Proposer

    assert "__len__" in registry.protocol_members(SchedulerQueue)
    assert "num_free_pages" in registry.protocol_members(Pool)
    assert "speculative" in registry.protocol_members(Proposer)
