"""A transfer's life cycle (``Transfer``): it moves through its states in order, and a step out of order is refused,
naming both states."""
from __future__ import annotations

import pytest

from reference_impl.pd.handoff import Transfer, TransferState, TransferStateError
from reference_impl.request import RequestSpec


def test_transfer_life_cycle() -> None:
    t = Transfer(RequestSpec("r", (1, 2), 1))
    for state in (TransferState.WAITING_FOR_INPUT, TransferState.TRANSFERRING, TransferState.TRANSFERRING,
                  TransferState.SUCCESS):
        t.advance(state)
    with pytest.raises(TransferStateError, match="success → failed"):
        t.advance(TransferState.FAILED)
    bootstrapping = Transfer(RequestSpec("s", (1,), 1))
    with pytest.raises(TransferStateError, match="bootstrapping → transferring"):
        bootstrapping.advance(TransferState.TRANSFERRING)
