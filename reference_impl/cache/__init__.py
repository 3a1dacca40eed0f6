"""The prefix cache: the radix tree over the device pool (L1), the host tier (L2), the storage tier (L3) and its stores.

``prefix_cache`` and ``store`` write the interfaces a cache level and a store level offer.
"""
