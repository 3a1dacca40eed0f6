"""The L3 stores ``cache = storage`` writes through to: ``base`` (the ``Store`` interface) and ``backends`` (file, redis)."""
