"""The run record: row schema (``rows``), report-directory layout (``files``), run header and options (``header``),
the store a run writes (``store``), the reader that merges report dirs (``reader``), the DataFrame view
(``frame``), and what is computed from the record: ``compare`` and ``locate`` (the failing combinations).

In a notebook: ``from harness.results.frame import read_frame; df = read_frame("reports/out")``.
"""
