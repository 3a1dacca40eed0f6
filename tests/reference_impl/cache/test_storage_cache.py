"""cache=storage: cross-instance reuse, tenant isolation, a store that disappears (the file store alone:
store/test_backends.py)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.workloads import load_workload
from harness.sut.reference.engine import build_engine_config
from harness.run.serve import run_workload
from reference_impl.cache.store.backends import RedisStore, StoreError
from reference_impl.engine.llm_engine import Engine
from tests.binaries import required_binary

LEVELS = {"cache": "storage", "model": "dense", "page_size": 16}


def engine(store: str, location: str, tenant: str = "a", model: str = "dense", workload: str = "system_prompt") -> Engine:
    config = build_engine_config({**LEVELS, "model": model, "store": store}, load_workload(workload), frozenset())
    return Engine(replace(config, store_location=location, tenant=tenant))


def serve_twice(store: str, location: str, tenant_b: str, model: str = "dense") -> tuple[list, list]:
    """Instance A serves the workload; instance B (fresh L1 and L2, same store) serves it again."""
    requests = load_workload("system_prompt").requests
    first = {o.rid: o for o in engine(store, location, "a", model).generate(requests)}
    second = engine(store, location, tenant_b, model).generate(requests)
    return [first[o.rid] for o in second], second


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_two_instances_sharing_a_file_store_reuse_prefixes(tmp_path: Path, model: str) -> None:
    first, second = serve_twice("file", str(tmp_path), "a", model)
    assert sum(o.cached_storage for o in second) > 0
    assert all(a.tokens == b.tokens and a.logprobs == b.logprobs for a, b in zip(first, second))


@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_tails_l2_cannot_keep_come_back_from_the_store(model: str) -> None:
    workload = load_workload("spill_storage")
    run = run_workload({**LEVELS, "model": model, "store": "file"}, workload, frozenset())
    cold, warm = ({o.rid: o for o in run.passes[p].outputs} for p in ("cold", "warm"))
    assert all(warm[r].tokens == cold[r].tokens and warm[r].logprobs == cold[r].logprobs for r in cold)
    split = {(warm[r].cached_device, warm[r].cached_host, warm[r].cached_storage) for r in workload.tails}
    assert split == {(32, 0, 16)}  # the head from L1, each tail from L3 through L2


def test_no_hit_crosses_tenants(tmp_path: Path) -> None:
    first, second = serve_twice("file", str(tmp_path), "b")
    assert sum(o.cached_storage for o in second) == 0
    assert all(a.tokens == b.tokens for a, b in zip(first, second))


def serve_spill_losing_the_store(store: str, location: str, lose: Callable[[Engine], None]) -> Engine:
    """Serve spill_storage cold, ``lose`` the engine's store, serve it warm: tails the store held become misses."""
    workload = load_workload("spill_storage")
    eng = engine(store, location, workload="spill_storage")
    cold = {o.rid: o for o in eng.generate(workload.requests)}
    lose(eng)
    warm = {o.rid: o for o in eng.generate(workload.requests)}
    assert all(o.tokens == cold[o.rid].tokens and o.logprobs == cold[o.rid].logprobs for o in warm.values())
    assert {(warm[r].cached_tokens, warm[r].cached_storage) for r in workload.tails} == {(32, 0)}  # head only
    assert not eng.audit()
    return eng


def test_a_removed_store_directory_turns_into_misses(tmp_path: Path) -> None:
    eng = serve_spill_losing_the_store("file", str(tmp_path), lambda eng: shutil.rmtree(tmp_path))
    assert eng.cache.store_errors and "does not exist" in eng.cache.store_errors[0]


@pytest.mark.parametrize("failure", ["raises", "vanished"])
def test_a_store_failing_at_load_back_turns_into_misses(tmp_path: Path, failure: str) -> None:
    def lose(eng: Engine) -> None:  # exists still answers; the read once the request fits fails or finds nothing
        def batch_get(keys: list[str]) -> list:
            if failure == "raises":
                raise StoreError("file store read failed (injected)")
            return [None] * len(keys)
        eng.cache.store.batch_get = batch_get

    eng = serve_spill_losing_the_store("file", str(tmp_path), lose)
    injected = [error for error in eng.cache.store_errors if "injected" in error]
    assert bool(injected) == (failure == "raises")  # a vanished key is a plain miss, not an error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binary() -> str:
    """The redis-server path; skip without one, except under CI=true, where a missing server fails."""
    return required_binary("redis-server", "the Redis tests")


def test_a_missing_redis_fails_under_ci_and_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        redis_binary()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        redis_binary()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A private redis-server on 127.0.0.1; skipped without one, except under CI=true where that fails."""
    binary = redis_binary()
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            RedisStore(url).exists(["ping"])
            break
        except StoreError:
            time.sleep(0.05)
    yield url, proc
    proc.terminate()
    proc.wait(timeout=10)


def test_two_instances_sharing_redis_reuse_prefixes(redis_url: tuple[str, subprocess.Popen]) -> None:
    first, second = serve_twice("redis", redis_url[0], "a")
    assert sum(o.cached_storage for o in second) > 0
    assert all(a.tokens == b.tokens and a.logprobs == b.logprobs for a, b in zip(first, second))


def test_redis_stopped_mid_run_gives_no_wrong_token(redis_url: tuple[str, subprocess.Popen]) -> None:
    url, proc = redis_url

    def stop(eng: Engine) -> None:
        proc.terminate()
        proc.wait(timeout=10)

    eng = serve_spill_losing_the_store("redis", url, stop)
    assert eng.cache.store_errors and "redis" in eng.cache.store_errors[0]


def test_store_is_ignored_unless_cache_is_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVMATRIX_REDIS_URL", raising=False)
    workload = load_workload("pair")
    Engine(build_engine_config({"cache": "host", "store": "redis"}, workload, frozenset()))
    with pytest.raises(StoreError, match="no URL"):
        Engine(build_engine_config({"cache": "storage", "store": "redis"}, workload, frozenset()))


def test_harness_runs_sharing_one_redis_do_not_share_prefixes(
    redis_url: tuple[str, subprocess.Popen], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVMATRIX_REDIS_URL", redis_url[0])
    levels = {**LEVELS, "store": "redis"}
    for _ in range(2):
        run = run_workload(levels, load_workload("spill_storage"), frozenset())
        assert sum(o.cached_storage for o in run.passes["cold"].outputs) == 0
        assert sum(o.cached_storage for o in run.passes["warm"].outputs) > 0
