"""Reproducers: a failing cell of a finished run, shrunk while the same check fails, written as one standalone script
an engine's maintainers can run (``harness repro``).

``finding`` picks the cell, its check and the one toggled setting; ``trial`` runs a configuration on any workload as
the matrix does; ``ddmin`` and ``shrink`` make the workload small; ``scripts`` writes one engine's script, its checks
and serve function copied from ``standalone``; ``report`` writes the finding folder; ``reproduce`` puts them in order.
"""
