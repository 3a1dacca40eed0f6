"""The reference data plane: a tiny seeded model served by a paged, cached, batched engine."""
