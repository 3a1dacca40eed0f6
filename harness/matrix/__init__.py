"""Matrices: the model (``model``: factors, constraints, cells), the TOML file (``file``, with the tables that name
levels in ``tables`` and the declarations in ``declared``), ``--cell``/``--shard`` selection (``selection``) and
covering arrays (``covering/``). An engine's factors and defaults are its package's (``harness.sut``)."""
