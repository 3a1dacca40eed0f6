"""The prefix cache: the radix tree over the device pool (L1), the host tier (L2), the storage tier (L3) and its stores.

``prefix_cache`` and ``store.base`` write the interfaces a cache level and a store level offer. ``radix`` is
L1 (``cache = device``), ``host_cache`` puts L2 under it (``cache = host``), ``storage_cache`` L3 under that
(``cache = storage``), and ``store.backends`` holds the stores L3 is kept in (``store = file``, ``redis``).
"""
