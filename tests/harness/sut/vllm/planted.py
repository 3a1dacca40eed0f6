"""Run with vLLM's interpreter by test_inside.py: one bug planted in the installed vLLM for this process only, then the
harness's child (``harness/sut/vllm/child.py``, its pool audit and, asked, its NaN poison on) serves one workload twice
(cold, warm) on one engine with prefix caching. Reads ``{"engine_args", "serve", "plant", "poison"}`` on stdin, prints
``{"cold", "warm"}`` (the two serve answers) as JSON. The plants, each a bug the audit or the poison must see:

- ``no_ref``: a prefix-cache hit takes no block reference (``BlockPool.touch`` does nothing): the hit blocks sit in a
  request's block table with ``ref_cnt`` 0, still in the free queue, free to be handed out under it;
- ``skip``: a running request is left out of one step (``Scheduler.schedule`` hides the last running request at the
  first step with two running, then puts it back): it is only late, every token right;
- ``read_past``: attention reads one slot past what was written (``CPUAttentionMetadataBuilder.build`` with every
  ``seq_len`` one more): the slot's stale bytes, NaN where the KV cache is poisoned;
- ``read_one_fewer``: a PD decode side reads one block fewer than it needs (``NixlPullConnectorWorker._read_blocks``
  drops the last block of each group of every read): that block keeps what the decode side's pool held, NaN where
  its KV cache is poisoned;
- ``none``: nothing planted.

``planted.py child PLANT`` is the harness's child itself with PLANT planted (``KVMATRIX_VLLM_PYTHON`` pointed at a
wrapper that runs it), so a PD pair the harness starts runs the plant on both sides.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "harness" / "sut" / "vllm"))
import child  # noqa: E402  (the child imports only the standard library, vllm and torch)


def plant_no_ref() -> None:
    """A prefix hit that takes no block reference."""
    from vllm.v1.core.block_pool import BlockPool

    BlockPool.touch = lambda self, blocks: None


def plant_skip() -> None:
    """The last running request hidden from the first step that has two running."""
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule, done = Scheduler.schedule, []

    def skipping(self: Any, *args: Any, **kwargs: Any) -> Any:
        if done or len(self.running) < 2:
            return schedule(self, *args, **kwargs)
        done.append(self.current_step + 1)
        hidden = self.running.pop()
        try:
            return schedule(self, *args, **kwargs)
        finally:
            self.running.append(hidden)

    Scheduler.schedule = skipping


def plant_read_past() -> None:
    """Attention one slot past what was written, in every request of every step."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder

    build = CPUAttentionMetadataBuilder.build

    def past(self: Any, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        longer = dataclasses.replace(common_attn_metadata, seq_lens=common_attn_metadata.seq_lens + 1,
                                     max_seq_len=common_attn_metadata.max_seq_len + 1)
        return build(self, common_prefix_len, longer, fast_build)

    CPUAttentionMetadataBuilder.build = past


def plant_read_one_fewer() -> None:
    """Every NIXL read one block short, in each group."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker

    read = NixlPullConnectorWorker._read_blocks

    def fewer(self: Any, read_spec: Any, *args: Any, **kwargs: Any) -> Any:
        short = dataclasses.replace(read_spec, local_block_ids=[ids[:-1] for ids in read_spec.local_block_ids],
                                    remote_block_ids=[ids[:-1] for ids in read_spec.remote_block_ids])
        return read(self, short, *args, **kwargs)

    NixlPullConnectorWorker._read_blocks = fewer


PLANTS = {"no_ref": plant_no_ref, "skip": plant_skip, "read_past": plant_read_past,
          "read_one_fewer": plant_read_one_fewer, "none": lambda: None}


def main() -> int:
    if sys.argv[1:2] == ["child"]:  # the harness's child, planted
        PLANTS[sys.argv[2]]()
        return child.main()
    msg = json.loads(sys.stdin.read())
    PLANTS[msg["plant"]]()
    engine = child.Child()
    engine.start({"engine_args": msg["engine_args"], "poison": msg["poison"], "audit": True})
    serve = msg["serve"]  # harness.sut.vllm.protocol.serve_message
    print(json.dumps({"cold": engine.serve(serve), "warm": engine.serve(serve)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
