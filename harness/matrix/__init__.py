"""Matrices: the model (``model``: factors, constraints, cells), the one defaults table (``levels``), the TOML
file (``file``), ``--cell``/``--shard`` selection (``selection``) and covering arrays (``covering/``)."""
