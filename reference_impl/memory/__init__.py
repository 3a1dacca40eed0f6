"""Device memory: the static and unified pools, NaN poison, and the L2 host pool with its page mover."""
