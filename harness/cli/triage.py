"""The commands that read report directories: ``report`` (re-render, merge shards), ``compare``, ``locate``.

Bad input (a missing directory, malformed rows) is exit 2 with every bad line named on
stderr as ``FILE:LINE: reason``; the rest of the rows are still used, so a person sees the
report while CI sees the failure.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import oracles
from harness.results.compare import TOLERANCES, compare, text
from harness.results.files import INDEX, PROBES, RESULTS, RUNS
from harness.results.header import file_sha256
from harness.results.hosts import differing_cells, differing_text
from harness.results.reader import RunData, load, planned, summarize, write_summary
from harness.results.rows import write_lines
from harness.run.locate import MAX_PROBED, locate, located_text
from harness.run.session import MatrixRun
from reports.html import write_compare, write_report
from reports.junit import write_junit


class TriageInputError(ValueError):
    """A path or option of report/compare/locate that cannot be used; the message names it."""


def _load(paths: Sequence[str]) -> tuple[RunData, bool]:
    """Read report dirs or results files; warn on every problem line; True when some line was bad."""
    try:
        data = load([Path(p) for p in paths])
    except FileNotFoundError as exc:
        raise TriageInputError(str(exc)) from None
    for problem in data.problems:
        print(f"warning: {problem}", file=sys.stderr)
    for note in data.notes:
        print(f"warning: duplicate cell {note}", file=sys.stderr)
    if data.problems:
        first = data.problems[0]
        print(f"error: {len(data.problems)} malformed line(s); first at {first.path}:{first.line}: {first.reason}",
              file=sys.stderr)
    return data, bool(data.problems)


def cmd_report(args: argparse.Namespace) -> int:
    """Re-render one report directory in place, or merge several (shards) into ``--out``."""
    data, bad = _load(args.paths)
    single_dir = len(args.paths) == 1 and Path(args.paths[0]).is_dir()
    if args.out is None and not single_dir:
        raise TriageInputError("report: --out DIR is required to merge several inputs (or to render a results file)")
    out = Path(args.out) if args.out else Path(args.paths[0])
    if not (single_dir and out.resolve() == Path(args.paths[0]).resolve()):
        out.mkdir(parents=True, exist_ok=True)
        write_lines(out / RESULTS, data.rows)
        write_lines(out / RUNS, data.runs)
        write_lines(out / PROBES, data.probes)
    summary = summarize(data.rows, data.runs, planned(data.runs, len(data.rows)))
    if data.replaced:
        summary["differing_cells"] = differing_cells(data.replaced, data.runs)
    write_summary(out, summary)
    write_report(out, data.rows, summary, data.probes, kinds=oracles.evidence_kinds())
    if args.junit:
        write_junit(Path(args.junit), data.rows, data.runs)
    counts = ", ".join(f"{n} {s}" for s, n in summary["counts"].items() if n)
    print(f"{len(data.rows)} cells from {len(args.paths)} input(s), {len(data.runs)} run(s): {counts or 'none'}")
    differing = summary.get("differing_cells", [])
    if differing:
        print(f"cells whose verdicts differ between inputs (the latter kept): {len(differing)}")
        print("\n".join(f"  {differing_text(item)}" for item in differing))
    print(f"report: {out / INDEX}")
    return 2 if bad else 0


def _tolerances(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    tolerances = dict(TOLERANCES)
    for item in items:
        metric, _, value = item.partition("=")
        try:
            tolerances[metric] = (float(value), tolerances.get(metric, (0.0, 1e-9))[1])
        except ValueError:
            raise TriageInputError(f"--tolerance {item!r}: expected METRIC=RELATIVE, e.g. engine_seconds=0.5") from None
    return tolerances


def cmd_compare(args: argparse.Namespace) -> int:
    """New failures, fixed, still failing and metric drift; exit 1 on new failures only."""
    (base, bad_base), (new, bad_new) = _load([args.base]), _load([args.new])
    comparison = compare(base.rows, new.rows, _tolerances(args.tolerance), base.runs, new.runs)
    print(text(comparison, args.base, args.new))
    if args.html:
        write_compare(Path(args.html), comparison, args.base, args.new)
        print(f"page: {args.html}")
    if bad_base or bad_new:
        return 2
    return 1 if comparison.new_failures else 0


def reopen(data: RunData, path: str, device: str | None) -> MatrixRun:
    """The run of a report directory opened again from its last header (matrix, strength, faults; the device
    unless ``device`` says otherwise), to run more cells of it; warns when the matrix file changed since."""
    if not data.runs:
        raise TriageInputError(f"{path}: no {RUNS} (a run header names the matrix, faults and device)")
    header = data.runs[-1]
    matrix = header.get("matrix_arg") or header["matrix_file"]
    run = MatrixRun.open(matrix, strength=header["strength"] if header.get("mode") == "t-wise" else None,
                         device=device or header.get("device", "cpu"), faults=header.get("faults", []))
    if file_sha256(run.matrix.path) != header.get("matrix_sha256"):
        print(f"warning: {run.matrix.path} changed since the run (sha256 differs); extra cells use it as it is now",
              file=sys.stderr)
    return run


def cmd_locate(args: argparse.Namespace) -> int:
    """Run the extra cells that settle each failure class of a report directory; print what fails."""
    data, bad = _load([args.dir])
    run = reopen(data, args.dir, args.device)
    header, device = data.runs[-1], run.device

    def run_one(cell):
        print(f"extra cell {cell.cell_id} …", flush=True)
        return {**run.run_cell(cell).to_json(), "run_id": header["run_id"], "device": device}

    result = locate(run.matrix, data.rows, run_one, data.probes, args.max_probed or MAX_PROBED)
    ran = result.probes[len(data.probes):]
    write_lines(Path(args.dir) / PROBES, result.probes)
    summary = summarize(data.rows, data.runs, planned(data.runs, len(data.rows)))
    write_summary(Path(args.dir), summary)
    write_report(Path(args.dir), data.rows, summary, result.probes, kinds=oracles.evidence_kinds())
    print(located_text(result, ran))
    print(f"report: {Path(args.dir) / INDEX}")
    if bad:
        return 2
    return 0 if all(c.pinned for c in result.classes) else 1


def add_triage_commands(sub: argparse._SubParsersAction) -> None:
    """Add report, compare and locate to the ``python -m harness`` parser."""
    report = sub.add_parser("report", help="re-render a report directory, or merge shards into one report")
    report.add_argument("paths", nargs="+", metavar="DIR_OR_FILE", help="report directories or results.jsonl files")
    report.add_argument("--out", metavar="DIR", help="write the merged report here (default: the one input directory)")
    report.add_argument("--junit", metavar="FILE", help="also write every cell as JUnit XML")
    report.set_defaults(handler=cmd_report)
    comp = sub.add_parser("compare", help="new failures, fixed, still failing and metric drift between two runs")
    comp.add_argument("base", metavar="BASE", help="the earlier run: report directory or results.jsonl")
    comp.add_argument("new", metavar="NEW", help="the later run: report directory or results.jsonl")
    comp.add_argument("--html", metavar="FILE", help="also write the comparison as a page")
    comp.add_argument("--tolerance", action="append", default=[], metavar="METRIC=REL",
                      help=f"relative drift allowed (defaults: {', '.join(f'{k}={v[0]}' for k, v in TOLERANCES.items())})")
    comp.set_defaults(handler=cmd_compare)
    loc = sub.add_parser("locate", help="run the extra cells that pin down each failing combination of a run")
    loc.add_argument("dir", metavar="DIR", help="the run's report directory")
    loc.add_argument("--max-probed", type=int, metavar="N", help="failing cells probed per oracle at most (default 8)")
    loc.add_argument("--device", help="device for the extra cells (default: the run's)")
    loc.set_defaults(handler=cmd_locate)
