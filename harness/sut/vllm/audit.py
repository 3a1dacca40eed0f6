"""pool_audit inside the vLLM child: after every engine step, vLLM's block pool checked against its scheduler's own
state, as the reference engine checks its pools (the mini-sglang ``check_integrity`` idea, for a real engine).

Runs in vLLM's interpreter (``child.py`` loads it by path): the standard library and vllm only. The engine core runs in
the child's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its scheduler is wrapped where it stands: ``schedule``
(what each step scheduled, and the requests it was given back) and ``update_from_output`` (the step's end, when the
pool is audited). Each rule is vLLM 0.32.0's own, read in ``v1/core/block_pool.py``, ``single_type_kv_cache_manager.py``
and ``sched/scheduler.py``:

- a block's ``ref_cnt`` is the number of block tables that hold it: every request the scheduler still keeps (running,
  waiting with blocks, finished but leased to a KV connector, as a PD prefill side keeps them) in every KV cache
  group's ``req_to_blocks``, and the blocks a deferred free still holds (``Scheduler.deferred_frees``); a block table
  of a request the scheduler no longer knows is a leak;
- the free queue holds exactly the blocks with ``ref_cnt`` 0, once each, and counts them right; it never holds the
  null block, which has no hash and is the only block marked null;
- every prefix-cache hash maps to blocks that carry it (``block_hash`` or ``cached_block_hashes_by_block``), and
  every block that carries a hash is in the map under it;
- a request never counts more computed tokens than its attention blocks hold;
- a running request the step did not preempt is scheduled in it, unless vLLM's own caps leave it nothing to run:
  the step's token and input budgets, ``max_model_len``, a Mamba block-aligned split, or a pool without the blocks
  it needs (``Scheduler.schedule`` stops serving running requests at a failed allocation, by design);
- a request admitted or resumed (after a preemption) counts as computed only the tokens its blocks still hold: each
  whole block of its prefix hit carries that prefix's hash (tokens a KV connector loads are left out: they are
  written after the step is scheduled).

Each problem names the step (vLLM's ``Scheduler.current_step``), the request or the block, and the two numbers that
differ; it is reported once, at the first step it is seen, and counted.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

#: problems an answer carries at most (the count is always whole).
MAX_PROBLEMS = 20
#: a vLLM request id in a problem, between unit separators until ``take`` writes it as the caller's name for it (the
#: ids are vLLM's own, known to the caller only from the answers)
_REQUEST = re.compile("\x1f([^\x1f]*)\x1f")


def _request(request_id: str) -> str:
    """``request_id`` marked for ``take``."""
    return f"\x1f{request_id}\x1f"


def _named(request_id: str, names: dict[str, str]) -> str:
    """The caller's name for a scheduler's request id: vLLM's is the id its answers carry, a '-' and 8 random
    characters after it (``InputProcessor.assign_request_id``)."""
    return names.get(request_id) or names.get(request_id.rsplit("-", 1)[0]) or request_id


class PoolAudit:
    """A scheduler's block pool audited after every step (the module's rules); ``take`` returns what was found since
    its last call. ``running`` is vLLM's ``RequestStatus.RUNNING``, ``attention`` the KV cache groups whose block
    tables hold every token (full attention): where blocks bound tokens. ``of`` builds it for an engine and installs
    it; a test builds it over stand-ins and calls the checks."""

    def __init__(self, scheduler: Any, running: object, attention: list[Any]) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.running = running
        self.attention = attention
        self.steps = 0
        self.seen: set[tuple] = set()
        self.problems: list[str] = []
        self.count = 0
        self.loaded: set[str] = set()  # requests a KV connector loaded tokens for: their blocks fill after the step

    @classmethod
    def of(cls, llm: Any) -> PoolAudit:
        """The audit of ``llm``'s engine core, wrapped around its scheduler (AttributeError where the engine core
        runs in another process)."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.request import RequestStatus

        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        groups = scheduler.kv_cache_manager.coordinator.single_type_managers
        audit = cls(scheduler, RequestStatus.RUNNING, [g for g in groups if isinstance(g.kv_cache_spec, FullAttentionSpec)])
        audit.install()
        return audit

    def take(self, names: dict[str, str] | None = None) -> dict:
        """The steps audited and the problems found since the last call (the first ``MAX_PROBLEMS``, and their
        count), each vLLM request id in ``names`` written as the caller's name for it."""
        names = names or {}
        problems = [_REQUEST.sub(lambda m: _named(m[1], names), p) for p in self.problems[:MAX_PROBLEMS]]
        found = {"steps": self.steps, "count": self.count, "problems": problems}
        self.steps, self.count, self.problems = 0, 0, []
        self.seen.clear()  # a problem that lasts into the next pass is that pass's too
        return found

    def report(self, key: tuple, message: str) -> None:
        """Record ``message`` once for ``key`` (what is wrong, and with what), at the step it is first seen."""
        if key not in self.seen:
            self.seen.add(key)
            self.count += 1
            self.problems.append(f"step {self.scheduler.current_step}: {message}")

    def install(self) -> None:
        """Wrap the scheduler: ``schedule`` checks what the step skipped and admitted, ``update_from_output`` ends
        the step with the pool's checks, ``allocate_slots`` notes the requests a KV connector loads for."""
        scheduler, manager = self.scheduler, self.manager
        schedule, update, allocate = scheduler.schedule, scheduler.update_from_output, manager.allocate_slots

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("num_external_computed_tokens", 0) > 0:
                self.loaded.add(request.request_id)
            return allocate(request, *args, **kwargs)

        def schedule_step(*args: Any, **kwargs: Any) -> Any:
            running = [r.request_id for r in scheduler.running]
            output = schedule(*args, **kwargs)
            self.check_skipped(running, output)
            self.check_admitted(output)
            return output

        def update_from_output(*args: Any, **kwargs: Any) -> Any:
            result = update(*args, **kwargs)
            self.steps += 1
            self.check_pool()
            return result

        manager.allocate_slots, scheduler.schedule, scheduler.update_from_output = (
            allocate_slots, schedule_step, update_from_output)

    def holders(self) -> tuple[Counter, dict[int, list[str]]]:
        """Block id → the block tables (and deferred frees) holding it, and → the requests among them."""
        held: Counter = Counter()
        owners: dict[int, list[str]] = {}
        for group in self.manager.coordinator.single_type_managers:
            for rid, blocks in group.req_to_blocks.items():
                if rid not in self.scheduler.requests and blocks:
                    self.report(("table", rid), f"request {_request(rid)}: {len(blocks)} block(s) in a block table "
                                                f"of a request the scheduler no longer knows (first: block "
                                                f"{blocks[0].block_id})")
                for block in blocks:
                    if not block.is_null:
                        held[block.block_id] += 1
                        owners.setdefault(block.block_id, []).append(rid)
        for _, blocks in getattr(self.scheduler, "deferred_frees", ()):
            for block in blocks:
                if not block.is_null and block.pool in (None, self.pool):
                    held[block.block_id] += 1
                    owners.setdefault(block.block_id, []).append("a deferred free")
        return held, owners

    def check_pool(self) -> None:
        """References against holders, the free queue against the unheld blocks, the hash map against the blocks,
        the null block, computed tokens against the blocks that hold them."""
        held, owners = self.holders()
        pool = self.pool
        for block in pool.blocks:
            if not block.is_null and block.ref_cnt != held[block.block_id]:
                who = ", ".join(_request(rid) for rid in sorted(set(owners.get(block.block_id, [])))) or "nothing"
                self.report(("ref", block.block_id, block.ref_cnt, held[block.block_id]),
                            f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by {held[block.block_id]} block "
                            f"table(s) ({who})")
        self.check_free_queue()
        self.check_hashes()
        self.check_computed()

    def check_free_queue(self) -> None:
        """The free queue is exactly the blocks with ``ref_cnt`` 0, once each, counted right, never the null block."""
        pool = self.pool
        queued = pool.free_block_queue.get_all_free_blocks()
        ids = [b.block_id for b in queued]
        for block_id, times in Counter(ids).items():
            if times > 1:
                self.report(("twice", block_id), f"block {block_id}: in the free queue {times} times")
        if len(ids) != pool.free_block_queue.num_free_blocks:
            self.report(("free count", len(ids), pool.free_block_queue.num_free_blocks),
                        f"free queue: {len(ids)} blocks linked, num_free_blocks {pool.free_block_queue.num_free_blocks}")
        free = set(ids)
        null = pool.null_block
        if null.block_id in free or null.block_hash is not None:  # its ref_cnt is not kept (BlockPool.__init__)
            self.report(("null", null.block_id), f"null block {null.block_id}: in the free queue "
                                                 f"{null.block_id in free}, hash {null.block_hash is not None}")
        for block in pool.blocks:
            if block is not null and block.is_null:
                self.report(("null", block.block_id), f"block {block.block_id}: marked null besides the null block "
                                                      f"{null.block_id}")
            elif block is not null and (block.ref_cnt == 0) != (block.block_id in free):
                self.report(("queue", block.block_id, block.ref_cnt),
                            f"block {block.block_id}: ref_cnt {block.ref_cnt}, in the free queue "
                            f"{block.block_id in free}")

    def check_hashes(self) -> None:
        """Every cached hash maps to blocks that carry it, and every hashed block is in the map under its hash."""
        pool = self.pool
        extra = pool.cached_block_hashes_by_block
        for key, found in pool.cached_block_hash_to_block._cache.items():
            for block in found.values() if isinstance(found, dict) else (found,):
                if block.block_hash != key and key not in extra.get(block.block_id, ()):
                    self.report(("hash", block.block_id, key), f"block {block.block_id}: a prefix-cache hash maps to "
                                                               f"it that it does not carry (its own: {block.block_hash!r:.40})")
        for block in pool.blocks:
            for key in ([block.block_hash] if block.block_hash is not None else []) + list(extra.get(block.block_id, ())):
                if not pool.cached_block_hash_to_block.contain(key, block.block_id):
                    self.report(("unmapped", block.block_id, key),
                                f"block {block.block_id}: carries a hash the prefix cache does not map to it")

    def check_computed(self) -> None:
        """No request counts more computed tokens than its attention blocks hold."""
        for group in self.attention:
            for rid, request in self.scheduler.requests.items():
                holds = len(group.req_to_blocks.get(rid, ())) * group.block_size
                if request.num_computed_tokens > holds:
                    self.report(("computed", rid, group.kv_cache_group_id),
                                f"request {_request(rid)}: {request.num_computed_tokens} tokens counted computed, its "
                                f"blocks in KV cache group {group.kv_cache_group_id} hold {holds}")

    def check_skipped(self, running: list[str], output: Any) -> None:
        """Every request running before the step, neither preempted nor finished by it, was scheduled in it, unless
        vLLM's caps leave it nothing (``runnable``)."""
        if output.preempted_req_ids:
            return  # a failed allocation ends the running requests' turn (Scheduler.schedule: "if new_blocks is None")
        for rid in running:
            request = self.scheduler.requests.get(rid)
            if request is None or request.status != self.running or rid in output.num_scheduled_tokens:
                continue
            tokens, left = self.runnable(request, output)
            if tokens > 0:
                self.report(("skipped", rid, self.scheduler.current_step),
                            f"request {_request(rid)}: running, not preempted, not scheduled: it needs {tokens} "
                            f"token(s) and the step left {left} of its budget")

    def runnable(self, request: Any, output: Any) -> tuple[int, int]:
        """The tokens vLLM's running-request rule would have given ``request`` from what the step left of its budget
        (``Scheduler.schedule``'s caps, the step's budget after every other request), 0 where its blocks cannot be had;
        and what was left."""
        scheduler = self.scheduler
        spec = scheduler.vllm_config.speculative_config
        draft_slots = spec.max_num_new_slots_for_drafting if spec is not None else 0
        scheduled = len(output.num_scheduled_tokens)
        left = scheduler.max_num_scheduled_tokens - output.total_num_scheduled_tokens
        inputs = scheduler.scheduler_config.max_num_batched_tokens - output.total_num_scheduled_tokens - draft_slots * scheduled
        need = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        tokens = min(need, left, inputs - draft_slots,
                     scheduler.max_model_len - request.num_computed_tokens - scheduler.num_sampled_tokens_per_step)
        if tokens > 0 and scheduler.need_mamba_block_aligned_split:
            tokens = scheduler._mamba_block_aligned_split(request, tokens)
        if tokens > 0 and self.blocks_needed(request, tokens) > self.pool.get_num_free_blocks():
            tokens = 0
        return max(tokens, 0), left

    def blocks_needed(self, request: Any, tokens: int) -> int:
        """The blocks ``request`` would need for ``tokens`` more (and the proposer's lookahead), every group counted
        (a Mamba group one block)."""
        total = request.num_computed_tokens + tokens + self.scheduler.num_lookahead_tokens
        need = 0
        for group in self.manager.coordinator.single_type_managers:
            have = len(group.req_to_blocks.get(request.request_id, ()))
            need += max(0, -(-total // group.block_size) - have) if group in self.attention else 1
        return need

    def check_admitted(self, output: Any) -> None:
        """A request admitted or resumed in this step counts as computed only what its blocks hold: each whole block
        of its prefix hit carries that prefix's hash."""
        new = [(r.req_id, r.num_computed_tokens) for r in output.scheduled_new_reqs]
        cached = output.scheduled_cached_reqs
        resumed = [(rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens) if rid in cached.resumed_req_ids]
        for rid, computed in new + resumed:
            request = self.scheduler.requests.get(rid)
            if request is not None and rid not in self.loaded and computed > 0:
                self.check_hit(request, computed)

    def check_hit(self, request: Any, computed: int) -> None:
        """Each whole block of ``request``'s first ``computed`` tokens carries the hash of that prefix."""
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id, resolve_block_hashes

        extra = self.pool.cached_block_hashes_by_block
        for group in self.attention:
            hashes = resolve_block_hashes(request.block_hashes, self.pool.hash_block_size, group.block_size)
            blocks = group.req_to_blocks.get(request.request_id, [])
            for j in range(min(computed // group.block_size, len(hashes), len(blocks))):
                key, block = make_block_hash_with_group_id(hashes[j], group.kv_cache_group_id), blocks[j]
                if block.block_hash != key and key not in extra.get(block.block_id, ()):
                    self.report(("hit", request.request_id, block.block_id),
                                f"request {_request(request.request_id)}: {computed} tokens counted computed at "
                                f"admission, but its block {block.block_id} (tokens {j * group.block_size} to "
                                f"{(j + 1) * group.block_size}) holds {'no cached prefix' if block.block_hash is None else 'another prefix'}")
                    return
