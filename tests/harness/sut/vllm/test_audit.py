"""The vLLM child's pool audit (``harness/sut/vllm/audit.py``) over stand-ins of vLLM's block pool and scheduler, shaped
as vllm 0.32.0's: a sound pool passes, and each rule fails on its own damage naming the block or request and the two
numbers (the real engine's planted bugs: test_inside.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from harness.sut.vllm.audit import PoolAudit

RUNNING, WAITING = "RUNNING", "WAITING"


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: object = None
    is_null: bool = False
    pool: object = None


class FreeQueue:
    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks
        self.num_free_blocks = len(blocks)

    def get_all_free_blocks(self) -> list[Block]:
        return list(self.blocks)


class HashMap:
    def __init__(self) -> None:
        self._cache: dict[object, Block] = {}

    def contain(self, key: object, block_id: int) -> bool:
        return key in self._cache and self._cache[key].block_id == block_id


@dataclass
class Request:
    request_id: str
    num_computed_tokens: int
    num_tokens_with_spec: int
    status: str = RUNNING
    num_output_placeholders: int = 0


@dataclass
class Group:
    block_size: int = 4
    kv_cache_group_id: int = 0
    req_to_blocks: dict = field(default_factory=dict)


def engine(blocks: int = 8) -> tuple[PoolAudit, SimpleNamespace, Group]:
    """An audit over a pool of ``blocks`` blocks (block 0 the null block), one attention group, no request."""
    pool = SimpleNamespace(blocks=[Block(i) for i in range(blocks)], cached_block_hash_to_block=HashMap(),
                           cached_block_hashes_by_block={}, enable_caching=True)
    pool.null_block = pool.blocks[0]
    pool.null_block.is_null = True
    pool.free_block_queue = FreeQueue(pool.blocks[1:])
    pool.get_num_free_blocks = lambda: pool.free_block_queue.num_free_blocks
    group = Group()
    manager = SimpleNamespace(block_pool=pool, coordinator=SimpleNamespace(single_type_managers=[group]))
    scheduler = SimpleNamespace(
        kv_cache_manager=manager, requests={}, running=[], current_step=7, deferred_frees=[],
        vllm_config=SimpleNamespace(speculative_config=None), max_num_scheduled_tokens=64,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64), max_model_len=128, num_sampled_tokens_per_step=1,
        need_mamba_block_aligned_split=False, num_lookahead_tokens=0)
    return PoolAudit(scheduler, RUNNING, [group]), pool, group


def admit(audit: PoolAudit, pool: SimpleNamespace, group: Group, rid: str, block_ids: list[int], computed: int) -> Request:
    """``rid`` holding ``block_ids`` as vLLM hands them out: each referenced once and taken off the free queue."""
    request = Request(rid, computed, computed + 1)
    audit.scheduler.requests[rid] = request
    audit.scheduler.running.append(request)
    group.req_to_blocks[rid] = [pool.blocks[i] for i in block_ids]
    for i in block_ids:
        pool.blocks[i].ref_cnt += 1
        if pool.blocks[i] in pool.free_block_queue.blocks:
            pool.free_block_queue.blocks.remove(pool.blocks[i])
            pool.free_block_queue.num_free_blocks -= 1
    return request


def checked(audit: PoolAudit) -> list[str]:
    audit.check_pool()
    return audit.take()["problems"]


def test_a_sound_pool_with_a_shared_cached_block_has_no_problem() -> None:
    audit, pool, group = engine()
    pool.blocks[1].block_hash = "h1"
    pool.cached_block_hash_to_block._cache["h1"] = pool.blocks[1]
    admit(audit, pool, group, "a", [1, 2], 6)
    admit(audit, pool, group, "b", [1, 3], 5)
    assert checked(audit) == []


def test_a_hit_that_takes_no_reference_names_the_block_and_both_counts() -> None:
    audit, pool, group = engine()
    admit(audit, pool, group, "a", [1, 2], 6)
    group.req_to_blocks["b"] = [pool.blocks[1], pool.blocks[3]]  # b's hit on block 1 took no reference
    audit.scheduler.requests["b"] = Request("b", 5, 6)
    pool.blocks[3].ref_cnt = 1
    pool.free_block_queue.blocks.remove(pool.blocks[3])
    pool.free_block_queue.num_free_blocks -= 1
    assert checked(audit) == ["step 7: block 1: ref_cnt 1, held by 2 block table(s) (a, b)"]


def test_requests_are_named_as_the_caller_names_them_and_only_where_vllms_id_stands() -> None:
    """vLLM's scheduler ids ("0-9c235fe6": the answer's id "0", a '-' and 8 random characters) begin with digits that
    also stand in block numbers and counts: only the ids are renamed."""
    audit, pool, group = engine()
    admit(audit, pool, group, "0-9c235fe6", [1, 2], 6)
    group.req_to_blocks["10-a4256682"] = [pool.blocks[1], pool.blocks[3]]  # its hit on block 1 took no reference
    audit.scheduler.requests["10-a4256682"] = Request("10-a4256682", 5, 6)
    pool.blocks[3].ref_cnt = 1
    pool.free_block_queue.blocks.remove(pool.blocks[3])
    pool.free_block_queue.num_free_blocks -= 1
    audit.check_pool()
    assert audit.take({"0": "sys-0", "10": "sys-1"})["problems"] == [
        "step 7: block 1: ref_cnt 1, held by 2 block table(s) (sys-0, sys-1)"]


def test_a_freed_block_left_off_the_free_queue_and_a_leaked_table_are_named() -> None:
    audit, pool, group = engine()
    admit(audit, pool, group, "a", [1, 2], 6)
    pool.blocks[2].ref_cnt = 0  # freed without going back to the queue
    del audit.scheduler.requests["a"]  # and the scheduler forgot a request whose table remains
    problems = checked(audit)
    assert "step 7: request a: 2 block(s) in a block table of a request the scheduler no longer knows (first: block 1)" \
        in problems
    assert "step 7: block 2: ref_cnt 0, in the free queue False" in problems


def test_a_hash_whose_block_does_not_carry_it_and_computed_tokens_past_the_blocks_fail() -> None:
    audit, pool, group = engine()
    admit(audit, pool, group, "a", [1, 2], 9)  # 9 computed tokens in two blocks of 4
    pool.cached_block_hash_to_block._cache["h9"] = pool.blocks[2]
    problems = checked(audit)
    assert "step 7: request a: 9 tokens counted computed, its blocks in KV cache group 0 hold 8" in problems
    assert any(p.startswith("step 7: block 2: a prefix-cache hash maps to it") for p in problems), problems


def test_a_running_request_skipped_with_budget_left_is_named_and_one_without_is_not() -> None:
    audit, pool, group = engine()
    admit(audit, pool, group, "a", [1], 3)
    admit(audit, pool, group, "b", [2], 3)
    output = SimpleNamespace(preempted_req_ids=set(), num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1)
    audit.check_skipped(["a", "b"], output)
    assert audit.take()["problems"] == [
        "step 7: request b: running, not preempted, not scheduled: it needs 1 token(s) and the step left 63 of its budget"]
    full = SimpleNamespace(preempted_req_ids=set(), num_scheduled_tokens={"a": 64}, total_num_scheduled_tokens=64)
    audit.check_skipped(["a", "b"], full)
    preempting = SimpleNamespace(preempted_req_ids={"c"}, num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1)
    audit.check_skipped(["a", "b"], preempting)
    audit.scheduler.requests["b"].status = WAITING  # no longer running: not skipped
    audit.check_skipped(["a", "b"], output)
    assert audit.take()["problems"] == []


def test_a_problem_is_reported_once_per_pass_and_counted() -> None:
    audit, pool, group = engine()
    admit(audit, pool, group, "a", [1], 3)
    pool.blocks[1].ref_cnt = 2
    audit.check_pool()
    audit.check_pool()
    assert audit.take() == {"steps": 0, "count": 1, "problems": ["step 7: block 1: ref_cnt 2, held by 1 block table(s) (a)"]}
    audit.check_pool()
    assert audit.take()["count"] == 1  # still there in the next pass: that pass's too
