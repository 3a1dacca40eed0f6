"""Running cells: plan a cell, open its system under test, serve its workloads cold then warm, judge it.

``runner`` (golden runs, one cell), ``oracles`` (the judges), ``parallel`` (``-j``: cells in worker
processes), ``faultcheck`` (``harness kill``: each fault against its trigger cells), ``probes``
(``harness locate``'s extra cells).
"""
