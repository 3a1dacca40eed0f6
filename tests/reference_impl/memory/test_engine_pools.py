"""An engine's pools (``EnginePools``): a page freed in the target pool alone is a draft page leak, and the integrity
check says so."""
from __future__ import annotations

import pytest

from reference_impl.config import DENSE
from reference_impl.memory.engine_pools import EnginePools
from reference_impl.memory.static import PoolIntegrityError, StaticPools
from reference_impl.spec.draft_model import draft_config


def test_engine_pools_report_a_draft_page_leak() -> None:
    kwargs = dict(page_size=4, num_pages=8, num_state_slots=1)
    pools = EnginePools(StaticPools(DENSE, **kwargs), StaticPools(draft_config(DENSE), **kwargs))
    pages = pools.alloc_pages(3)
    pools.check_integrity()
    pools.target.free_pages(pages)  # freed in the target pool only: the draft's pages leak
    with pytest.raises(PoolIntegrityError, match="draft pool pages leaked"):
        pools.check_integrity()
