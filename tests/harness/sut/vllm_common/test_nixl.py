"""vLLM's NIXL byte rule on its own: the blocks past the backoff and the decode side's hit, and the states read."""
from __future__ import annotations

import ast
import inspect

from harness.sut.vllm_common import nixl


def test_a_dense_pair_moves_every_block_past_the_decode_sides_hit() -> None:
    """Prompts of 64 and 33 tokens in 32-token blocks, a one-block hit, no state: 2 + 2 - 1 blocks."""
    moved, why = nixl.nixl_bytes([64, 33], backoff=0, hit=32, block_size=32, block_bytes=1000, state_bytes=0)
    assert moved == 3000 and why.startswith("3 block(s) past the decode side's hit × 1000 B")


def test_a_hybrid_pair_backs_off_one_token_and_moves_each_read_requests_state() -> None:
    """65 tokens less the one the decode side computes: 2 blocks; 33: 1; states of the requests read alone."""
    assert nixl.nixl_bytes([65, 33], 1, 0, 32, 1000, 7)[0] == 3 * 1000 + 2 * 7
    assert nixl.nixl_bytes([65, 33], 1, 0, 32, 1000, 7, states=1)[0] == 3 * 1000 + 7


def test_the_rule_a_script_copies_in_imports_nothing() -> None:
    """Its body names built-ins alone: a script carries the function without the module's imports."""
    tree = ast.parse(inspect.getsource(nixl.nixl_bytes))
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_each_failure_vllm_logs_is_read_with_the_exception_its_traceback_ends_in() -> None:
    """vLLM's formatter repeats a record's header on each line of its traceback; the header is taken off, the
    exception kept, a failure without a traceback read alone, and no other line taken."""
    header = "(EngineCore pid=7) ERROR 12-07 10:00:00 [base_worker.py:1260] "
    log = "\r\n".join([
        "INFO 12-07 09:59:59 [core.py:1] a line about something else",
        header + "NIXL transfer failure: transfer_exception | Context: {'request_id': 'sys-0'}",
        header + "Traceback (most recent call last):",
        header + '  File "base_worker.py", line 3083, in _pop_done_transfers',
        header + "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND",
        header + "NIXL transfer failure: transfer_failed | Context: {'xfer_state': 'ERR'}",
    ])
    assert nixl.failure_lines(log) == [
        "NIXL transfer failure: transfer_exception | Context: {'request_id': 'sys-0'} "
        "<- nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND",
        "NIXL transfer failure: transfer_failed | Context: {'xfer_state': 'ERR'}",
    ]
    assert nixl.failure_lines("INFO nothing failed\n") == []
