"""The report directory's layout: every file a run, a merge or ``locate`` writes there, named once."""
from __future__ import annotations

from pathlib import Path

#: where ``harness run`` and ``pytest -m matrix`` write unless told otherwise.
DEFAULT_REPORT_DIR = Path("reports/out")
RESULTS = "results.jsonl"            # one row per cell, streamed as cells end
RUNS = "runs.jsonl"                  # one header per invocation that wrote rows (each shard, each resume)
PROBES = "locate.jsonl"              # the extra cells ``harness locate`` ran
REJECTED = "results.rejected.jsonl"  # lines of results.jsonl that could not be read, moved aside as they were
SUMMARY = "summary.json"             # counts per status and oracle, rebuilt from the whole directory
INDEX = "index.html"                 # the report page
LOCK = ".lock"                       # every writer holds it (xdist workers and shards share one directory)
