"""Running cells: one cell's path in stages, ``plan`` → ``golden`` → ``serve`` → ``judge`` → ``row``, composed in
``cell``; ``session`` (a run opened the same way by every entry point), ``parallel`` (``-j``: cells in worker
processes), ``faultcheck`` (``harness kill``: each fault against its trigger cells), ``locate`` (``harness
locate``'s extra cells).
"""
