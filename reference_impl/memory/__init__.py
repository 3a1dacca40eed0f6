"""Device memory: the static and unified pools, NaN poison, and the L2 host pool with its page mover.

``pool`` writes the interface every pool offers, ``engine_pools`` an engine's target and draft pools.
"""
