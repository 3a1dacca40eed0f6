"""Mutation score: of the one-line slips Cosmic Ray makes in reference_impl, how many the matrix kills.

Cosmic Ray (``cosmic-ray``, its standard operators) enumerates the mutants of each module group (pd, cache,
memory, spec, engine) and applies them one at a time; a seeded sample of each group is judged first by the
mutation matrix (``benchmarks/mutation.toml``: torch backend, the smallest workloads that still exercise
each mechanism; the pd group by ``benchmarks/mutation_pd.toml``, in-process PD) and, where the matrix passes, by that group's unit tests. Everything runs in a scratch copy
of the tracked tree, so a mutant never lands in the working tree, even when the run is killed.

    python benchmarks/mutation.py run [--per-group N] [--seed S] [--out DIR]   # `make mutation`
    python benchmarks/mutation.py judge                                        # the matrix on this tree: exit 1 on a failing cell
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: module groups mutated, and the unit tests that judge a mutant the matrix let through.
GROUPS = {
    "pd": ("reference_impl/pd", [
        "tests/reference_impl/pd/test_disagg.py", "tests/reference_impl/pd/test_handoff.py",
        "tests/reference_impl/pd/test_staging.py", "tests/harness/oracles/test_pd_audit.py"]),
    "cache": ("reference_impl/cache", [
        "tests/reference_impl/cache/test_radix.py", "tests/reference_impl/cache/test_host_cache.py",
        "tests/reference_impl/memory/test_host.py", "tests/reference_impl/cache/test_storage_cache.py",
        "tests/reference_impl/cache/store/test_backends.py"]),
    "memory": ("reference_impl/memory", [
        "tests/reference_impl/memory/test_unified.py", "tests/reference_impl/memory/test_poison.py",
        "tests/reference_impl/cache/test_host_cache.py", "tests/reference_impl/memory/test_host.py",
        "tests/reference_impl/pd/test_disagg.py", "tests/reference_impl/pd/test_handoff.py",
        "tests/reference_impl/pd/test_staging.py"]),
    "spec": ("reference_impl/spec", [
        "tests/reference_impl/spec/test_verify.py", "tests/reference_impl/spec/test_ngram.py",
        "tests/reference_impl/memory/test_engine_pools.py"]),
    "engine": ("reference_impl/engine", [
        "tests/reference_impl/engine/test_llm_engine.py", "tests/reference_impl/spec/test_verify.py",
        "tests/reference_impl/spec/test_ngram.py", "tests/reference_impl/memory/test_engine_pools.py",
        "tests/reference_impl/cache/test_radix.py",
        "tests/reference_impl/test_faults.py::test_fault_fails_exactly_its_trigger_cells[slot_stride_int32]"]),
}
JUDGE_TIMEOUT_S, UNIT_TIMEOUT_S = 300, 300


#: the judge matrix of each group (benchmarks/NAME.toml); the others use ``mutation``
JUDGES = {"pd": "mutation_pd"}


def judge(matrix: str = "mutation") -> int:
    """Run a mutation matrix on the tree as it is; print each failing cell's oracles; 1 if any cell fails."""
    from harness.matrix.model import generate
    from harness.matrix.file import load_matrix
    from harness.run.golden import GoldenRuns
    from harness.run.cell import configure_torch, run_cell

    configure_torch()
    matrix, goldens, failed = load_matrix(str(ROOT / "benchmarks" / f"{matrix}.toml")), GoldenRuns(), 0
    for cell in generate(matrix):
        result = run_cell(matrix, cell, faults=frozenset(), goldens=goldens)
        if result.status != "pass":
            failed += 1
            seen = [name for name, v in result.oracles.items() if v.status == "fail"] or [f"error: {(result.error or '')[-200:]}"]
            print(f"{cell.cell_id}: {result.status} {seen}", flush=True)
    return 1 if failed else 0


def scratch_copy() -> Path:
    """The tracked tree, copied into a fresh temporary directory."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    dest = Path(tempfile.mkdtemp(prefix="kvmatrix-mutation-"))
    for name in filter(None, files):
        path = Path(name.decode())
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, dest / path)
    return dest


def enumerate_mutants(tree: Path, group: str, package: str) -> list:
    """Every work item Cosmic Ray generates for one package (``cosmic-ray init`` into a session of its own)."""
    from cosmic_ray.work_db import WorkDB, use_db

    config, session = tree / f"cr-{group}.toml", tree / f"cr-{group}.sqlite"
    config.write_text(f'[cosmic-ray]\nmodule-path = "{package}"\ntimeout = {JUDGE_TIMEOUT_S}\nexcluded-modules = []\n'
                      f'test-command = "{sys.executable} benchmarks/mutation.py judge"\n'
                      '[cosmic-ray.distributor]\nname = "local"\n')
    # next to this interpreter (make mutation installs it there), else wherever PATH finds it (pip --target)
    cosmic_ray = Path(sys.executable).parent / "cosmic-ray"
    cosmic_ray = str(cosmic_ray) if cosmic_ray.exists() else shutil.which("cosmic-ray") or str(cosmic_ray)
    subprocess.run([cosmic_ray, "init", str(config), str(session)], cwd=tree, check=True)
    with use_db(str(session), WorkDB.Mode.open) as db:
        return list(db.work_items)


def judge_one(item: object, units: list[str], matrix: str = "mutation") -> dict:
    """The verdict on one mutant: killed by the matrix, killed only by the unit tests, survived (or incompetent)."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import TestOutcome

    started = time.perf_counter()
    matrix = mutate_and_test(item.mutations, f"{sys.executable} benchmarks/mutation.py judge --matrix {matrix}",
                             JUDGE_TIMEOUT_S)
    verdict, output = "matrix", matrix.output or ""
    if matrix.test_outcome == TestOutcome.SURVIVED:
        unit = mutate_and_test(item.mutations, f"{sys.executable} -m pytest -x -q -p no:xdist -p no:cacheprovider "
                               f"{' '.join(units)}", UNIT_TIMEOUT_S)
        verdict = {TestOutcome.KILLED: "unit", TestOutcome.SURVIVED: "survived"}.get(unit.test_outcome, "incompetent")
        output = unit.output or ""
    elif matrix.test_outcome != TestOutcome.KILLED:
        verdict = "incompetent"
    mutation = item.mutations[0]
    return {"job": item.job_id, "module": str(mutation.module_path), "operator": mutation.operator_name,
            "occurrence": mutation.occurrence, "line": mutation.start_pos[0], "verdict": verdict,
            "timeout": output.strip() == "timeout", "diff": matrix.diff, "seconds": round(time.perf_counter() - started, 1),
            "matrix_output": (matrix.output or "")[-600:]}


def run(per_group: int, seed: int, out: Path, groups: list[str]) -> None:
    """Enumerate, sample ``per_group`` mutants of each of ``groups`` (seeded), judge them, write rows and the table."""
    tree, rng = scratch_copy(), random.Random(seed)
    load, started, rows, table = os.getloadavg(), time.perf_counter(), [], []
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(tree)
    try:
        for name in sorted({JUDGES.get(g, "mutation") for g in groups}):
            baseline = subprocess.run([sys.executable, "benchmarks/mutation.py", "judge", "--matrix", name],
                                      capture_output=True, text=True)
            if baseline.returncode:  # a judge that fails unmutated would count every mutant as killed
                raise SystemExit(f"the {name} matrix fails without a mutant:\n{baseline.stdout}{baseline.stderr}")
        for group in groups:
            package, units = GROUPS[group]
            items = enumerate_mutants(tree, group, package)
            sample = sorted(rng.sample(items, min(per_group, len(items))), key=lambda i: i.job_id)
            group_started = time.perf_counter()
            for item in sample:
                rows.append({"group": group, **judge_one(item, units, JUDGES.get(group, "mutation"))})
                print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("diff", "matrix_output")}), flush=True)
            counts = Counter(r["verdict"] for r in rows if r["group"] == group)
            table.append({"group": group, "generated": len(items), "sampled": len(sample), **counts,
                          "seconds": round(time.perf_counter() - group_started)})
    finally:
        os.chdir(ROOT)
        shutil.rmtree(tree, ignore_errors=True)
    summary = {"seed": seed, "per_group": per_group, "load_before": load, "load_after": os.getloadavg(),
               "seconds": round(time.perf_counter() - started), "groups": table}
    (out / "mutants.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print_table(summary)


def print_table(summary: dict) -> None:
    """The BENCHMARKS.md table of one run."""
    print("| group | generated | sampled | killed by matrix | killed only by unit tests | survived | incompetent | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for g in summary["groups"]:
        print(f"| {g['group']} | {g['generated']} | {g['sampled']} | {g.get('matrix', 0)} | {g.get('unit', 0)} | "
              f"{g.get('survived', 0)} | {g.get('incompetent', 0)} | {g['seconds']} |")
    print(f"seed {summary['seed']}, {summary['seconds']} s, load average before {summary['load_before']}, "
          f"after {summary['load_after']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "judge"])
    parser.add_argument("--per-group", type=int, default=12, help="mutants sampled per module group")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "out" / "mutation")
    parser.add_argument("--groups", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    parser.add_argument("--matrix", default="mutation", help="judge: the matrix under benchmarks/ (mutation, mutation_pd)")
    args = parser.parse_args()
    if args.command == "judge":
        return judge(args.matrix)
    run(args.per_group, args.seed, args.out, args.groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
