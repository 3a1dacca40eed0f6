"""``harness repro``: a failing, error or xfail cell of a finished run → a finding folder with a standalone, shrunk
reproducer (``harness.repro``). Exit 0 when the folder is written (and its script, run at once, exits 1 as it must),
1 when there is nothing to reproduce, the failure does not reproduce or the script does not show it, 2 on bad input
(an engine without a script writer among it)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import sut
from harness.cli.triage import TriageInputError, _load, reopen
from harness.repro.finding import ReproError, writer_of
from harness.repro.report import OUTPUT, REPORT, write_finding
from harness.repro.reproduce import reproduce

#: runs a repro may spend unless ``--budget`` says otherwise.
DEFAULT_BUDGET = 60
#: where a finding folder goes unless ``--out`` says: under the run's report directory.
FINDINGS = "findings"


def cmd_repro(args: argparse.Namespace) -> int:
    if args.budget < 1:
        raise TriageInputError(f"--budget {args.budget}: need at least 1 run")
    data, bad = _load([args.dir])
    if bad:
        return 2
    run = reopen(data, args.dir, args.device)
    try:
        writer_of(sut.engine(run.matrix.engine).program_name(run.matrix.engine_args))
    except ReproError as exc:
        raise TriageInputError(str(exc)) from None
    try:
        repro = reproduce(run, data.rows, data.probes, data.runs[-1], report_dir=Path(args.dir), cell_id=args.cell,
                          oracle=args.oracle, check=args.check, toggle_to=args.toggle,
                          budget=args.budget, say=lambda line: print(line, flush=True))
    except ReproError as exc:
        print(f"repro: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(args.dir) / FINDINGS / repro.slug
    script, ran = write_finding(repro, out, verify=not args.no_run)
    print(f"script: {script}")
    print(f"report: {out / REPORT}")
    if ran is None:
        return 0
    verdict = "exits 1 with the failing setting: the bug shows" if ran.status == 1 else \
        f"exited {ran.status}, not 1: it does not show the failure (see {out / OUTPUT})"
    print(f"ran the script: {verdict}")
    return 0 if ran.status == 1 else 1


def add_repro_command(sub: argparse._SubParsersAction) -> None:
    """Add ``repro`` to the ``python -m harness`` parser."""
    repro = sub.add_parser("repro", help="shrink a failing cell's workload and write a standalone reproducer script")
    repro.add_argument("dir", metavar="REPORT_DIR", help="the run's report directory")
    repro.add_argument("--cell", metavar="ID", help="the cell (default: the run's first failing, error or xfail cell)")
    repro.add_argument("--oracle", metavar="NAME", help="the failing oracle to keep (default: the planted fault's, "
                       "else the cell's first failing one)")
    repro.add_argument("--check", metavar="CHECK", help="the oracle's check to keep, as its findings name it (default: "
                       "its first finding's): inputs names each field, so a cell whose engine changes two is "
                       "reproduced for the one asked")
    repro.add_argument("--toggle", metavar="FACTOR=LEVEL", help="the one setting to toggle (default: the first "
                       "factor whose golden level cures the check): a level that keeps the mechanism the check's rule "
                       "is read from, where the golden level turns it off")
    repro.add_argument("--budget", type=int, default=DEFAULT_BUDGET, metavar="RUNS",
                       help=f"engine runs the re-run, toggle and shrink may spend (default {DEFAULT_BUDGET})")
    repro.add_argument("--out", metavar="DIR", help=f"the finding folder (default: REPORT_DIR/{FINDINGS}/<engine>-"
                       "<check>-<factor>-<level>)")
    repro.add_argument("--device", help="device for the runs (default: the run's)")
    repro.add_argument("--no-run", action="store_true", help="write the script without running it")
    repro.set_defaults(handler=cmd_repro)
