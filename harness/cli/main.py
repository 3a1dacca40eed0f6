"""The command line: list a matrix, run it, check faults on it, list them; report, compare, locate (harness.cli.triage);
repro (harness.cli.repro).

Exit 0 pass, 1 fail, 2 bad input; stopped by SIGINT, SIGTERM or SIGHUP: 128 + the signal (130, 143, 129), with one
line on stderr, after every process the command started is stopped (harness.sut.interrupt)."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from harness import oracles
from harness.cli.findings import add_findings_command
from harness.cli.progress import RunProgress
from harness.cli.repro import add_repro_command
from harness.cli.tables import add_table_commands
from harness.cli.triage import TriageInputError, add_triage_commands
from harness.matrix.covering import Covering
from harness.matrix.file import named_matrix
from harness.matrix.masking import NetCoverage, net_coverage
from harness.matrix.model import (
    Cell, MatrixError, coverage, generate, generate_certified, level_token, lower_bound, ofat_coverage,
)
from harness.matrix.selection import SelectionError, parse_shard, select_cells, select_shard
from harness.results.header import add_run_options
from harness.results.reader import load
from harness.results.rows import FAILING, CellResult
from harness.results.store import ResultsStore, ResumeRefused, RunInfo
from harness.run.faultcheck import check_fault, check_fault_set
from harness.run.parallel import default_jobs, execute
from harness.run.session import MatrixRun
from harness.sut import UnknownEngineError
from harness.sut.interrupt import signum_of, stop_on_signals
from harness.sut.process import logs_kept_under, stop_all
from reference_impl.faults import FAULTS, UnknownFaultError
from reports.html import write_report
from reports.junit import write_junit

#: the default of ``-j`` when set (the test suite sets 1: pytest -n already fills the cores).
JOBS_ENV = "KVMATRIX_JOBS"
#: the boundary family's example database under the report directory unless ``--examples-db`` names one
EXAMPLES_DIR = "hypothesis"


class UsageError(ValueError):
    """Bad command-line input (other than the matrix file itself)."""


def cmd_list(args: argparse.Namespace) -> int:
    matrix = named_matrix(args.matrix, args.strength)
    cells, certificate = generate_certified(matrix)
    for cell in cells:
        print(cell.cell_id)
    if matrix.mode == "ofat":  # the golden cell and each other level alone: not a covering array of any strength
        report = ofat_coverage(matrix, cells)
        print(f"{len(cells)} cells (ofat)")
        print(f"lower bound: {report.required} cells (the golden cell and one per level off it); "
              f"{'optimal (proven)' if len(cells) == report.required else f'ratio {len(cells) / report.required:.2f}'}")
        what = f"{report.required} (the golden cell, and each other level with every other factor golden)"
    elif matrix.mode == "cells":  # the cells [[cells]] chooses: the pairs it leaves out are its choice, named below
        report = coverage(matrix, cells, min(2, len(matrix.factors)))
        print(f"{len(cells)} cells (cells: chosen by {len(matrix.cell_choices)} [[cells]] entries)")
        what = f"{report.required} allowed {report.strength}-tuples"
    else:
        t = matrix.strength if matrix.mode == "t-wise" else min(2, len(matrix.factors))
        report = coverage(matrix, cells, t)
        array = len(cells) if certificate is None else len(certificate.rows)
        added = f": {array} of the covering array, {len(cells) - array} added net of masking" if array < len(cells) else ""
        print(f"{len(cells)} cells ({matrix.mode}{f', t={matrix.strength}' if matrix.mode == 't-wise' else ''}){added}")
        print(certificate_line(array, t, lower_bound(matrix, t), certificate))
        groups = "".join(f" + {s}-tuples of {', '.join(names)}" for names, s in matrix.stronger)
        what = f"{report.required} allowed {t}-tuples{groups}"
    if matrix.cost:
        print(f"total cost {math.fsum(matrix.cost_of(cell) for cell in cells):g} "
              f"([cost] per cell: sum of its levels' costs, unlisted levels 1)")
    label = "ofat" if matrix.mode == "ofat" else f"t={report.strength}"
    net = net_coverage(matrix, cells, None if matrix.mode == "ofat" else report.strength)
    if matrix.mode == "cells" and not report.ok:
        left = ", ".join(tuple_text(ttuple) for ttuple in report.missing)
        print(f"coverage {label}: {report.covered}/{what} covered: {len(report.missing)} left out by [[cells]]: {left}")
    else:
        print(f"coverage {label}: {report.covered}/{what} covered: {'OK' if report.ok else f'MISSING {len(report.missing)}'}")
    print_net_coverage(label, net, len(cells), matrix.mode == "cells")
    return 0 if matrix.mode == "cells" or (report.ok and net.ok) else 1


def print_net_coverage(label: str, net: NetCoverage, cells: int, chosen: bool) -> None:
    """``list``'s coverage net of masking: what the judged cells hold, the tuples only masked cells hold (those no
    judged cell can, then, in mode ``cells``, those the choice leaves to masked cells; elsewhere the generator adds
    cells for them), each under the ``[[expected]]`` entries that mask it."""
    state = "OK" if net.ok else f"{len(net.gaps)} left to masked cells by [[cells]]" if chosen else f"MISSING {len(net.gaps)}"
    print(f"coverage {label} net of masking: {net.net.covered}/{net.plain.required} held by a judged cell "
          f"({net.masked_cells} of {cells} cells masked whole by [[expected]]): {state}")
    for title, tuples in (("no judged cell can hold", net.masked), ("only masked cells hold", net.gaps)):
        by_numbers: dict[tuple[int, ...], list[str]] = {}
        for ttuple, numbers in tuples:
            by_numbers.setdefault(numbers, []).append(tuple_text(ttuple))
        for numbers, texts in sorted(by_numbers.items()):
            print(f"  {title}: masked by [[expected]] {' and '.join(f'#{n}' for n in numbers)} ({len(texts)}): "
                  f"{', '.join(texts)}")
    if net.oracles_excused:
        print(f"  {net.oracles_excused} judged cells have an oracle excused whole (an [[expected]] entry with no "
              f"signature): judged by their other oracles, they count as judged")


def tuple_text(ttuple: Sequence[tuple[str, object]]) -> str:
    """A tuple as ``list`` prints it: ``model:hybrid+cache:device`` (levels as in cell ids; ofat's tuple of no
    level, the golden cell: ``golden``)."""
    return "+".join(f"{factor}:{level_token(level)}" for factor, level in ttuple) or "golden"


def certificate_line(cells: int, t: int, counting: int, certificate: Covering | None) -> str:
    """What ``list`` claims: the lower bound, and "optimal" only when a bound proves it."""
    bound = counting if certificate is None else max(counting, certificate.bound)
    text = f"lower bound: {bound} cells (most allowed tuples on one set of factors: {counting}"
    text += ")" if bound == counting else ", raised by the solver)"
    if certificate is None:
        return f"{text}; ratio {cells / bound:.2f}"
    verdict = "optimal (proven)" if cells == bound else f"ratio {cells / bound:.2f}, not proven optimal"
    return f"{text}; {verdict}; built by {certificate.how}"


def jobs_option(value: int | None, in_process: bool = True) -> int:
    """``-j``: as given, else ``$KVMATRIX_JOBS``, else the cores this process may use; the cells of an engine out of
    process (a real engine) one at a time unless ``-j`` says otherwise (vLLM binds its OpenMP threads to every core)."""
    if value is None and not in_process:
        return 1
    if value is None:
        env = os.environ.get(JOBS_ENV, "")
        try:
            value = int(env) if env else default_jobs()
        except ValueError:
            raise UsageError(f"{JOBS_ENV}={env!r}: expected a whole number of worker processes") from None
    if value < 1:
        raise UsageError(f"-j {value}: need at least 1 worker process")
    return value


def cmd_run(args: argparse.Namespace) -> int:
    run = MatrixRun.open(args.matrix, strength=args.strength, device=args.device, faults=args.inject_fault)
    matrix, faults, goldens = run.matrix, run.faults, run.goldens
    jobs = jobs_option(args.jobs, run.in_process)
    generated = generate(matrix)
    cells = select_cells(matrix, generated, args.cell) if args.cell else generated
    cells = select_shard(cells, parse_shard(args.shard) if args.shard else None)
    header = run.header(args.matrix, args.shard, len(cells))
    info = RunInfo(matrix.name, matrix.mode, matrix.strength, sorted(faults), len(cells), header=header, device=args.device)
    store = ResultsStore(Path(args.report_dir), info, render=partial(write_report, kinds=oracles.evidence_kinds()))
    done = store.start(args.resume, {c.cell_id for c in cells}, accept_changed=args.accept_changed)
    run.examples_db = args.examples_db or str(store.dir / EXAMPLES_DIR)
    started = time.perf_counter()
    interrupted = 0  # the signal that stopped the run
    with RunProgress(len(cells)) as progress:
        for i, cell in enumerate(cells, 1):
            if cell.cell_id in done:
                print(f"[{i}/{len(cells)}] {cell.cell_id}: kept from the previous run", flush=True)
                progress.advance()
        try:  # what the cells' processes print is kept beside their rows
            with logs_kept_under(store.dir):
                _run_cells(run, cells, done, jobs, store, progress)
        except KeyboardInterrupt as exc:
            interrupted = signum_of(exc)
    store.finish(order=[c.cell_id for c in cells])
    ids = {c.cell_id for c in cells}
    rows = [r for r in load([store.dir]).rows if r["cell_id"] in ids] if store.results_path.exists() else []
    counts = Counter(r["status"] for r in rows)
    print(f"{len(rows)} cells: {', '.join(f'{n} {s}' for s, n in sorted(counts.items()))} in "
          f"{time.perf_counter() - started:.1f}s; golden runs {goldens.computed} computed, {goldens.reused} reused")
    if args.junit:
        write_junit(Path(args.junit), rows, [header.to_json()])
        print(f"junit: {args.junit}")
    print(f"report: {store.index_path}")
    if interrupted:
        print(f"interrupted by {signal_name(interrupted)}: {len(rows)} of {len(cells)} cells kept; --resume goes on "
              f"from there", file=sys.stderr)
        return 128 + interrupted
    return 1 if any(counts[status] for status in FAILING) else 0


def _run_cells(run: MatrixRun, cells: Sequence[Cell], done: set[str], jobs: int, store: ResultsStore,
               progress: RunProgress) -> None:
    """Run the cells not ``done``, ``jobs`` at a time (dearest first when side by side), each row stored as it ends."""
    matrix = run.matrix
    plans = [run.plan(cell) for cell in cells]
    todo = [i for i, cell in enumerate(cells) if cell.cell_id not in done]
    jobs = min(jobs, len(todo))
    if jobs > 1:
        todo.sort(key=lambda i: -matrix.cost_of(cells[i]))  # a stable sort: cell order among equals

    def on_step(i: int, what: str) -> None:
        progress.step(what, key=i, cell_id=cells[i].cell_id)

    def on_result(i: int, result: CellResult) -> None:
        store.add(result)
        progress.advance(key=i)
        failed = [name for name, v in result.oracles.items() if v.status == "fail"]
        note = f" ({', '.join(failed)})" if failed else (" (see error)" if result.error else "")
        print(f"[{i + 1}/{len(cells)}] {result.cell_id}: {result.status}{note} "
              f"{result.metrics.get('wall_seconds', 0):.1f}s", flush=True)

    execute(plans, run.goldens, jobs=jobs, on_step=on_step, on_result=on_result, order=todo)


def cmd_kill(args: argparse.Namespace) -> int:
    """Inject each fault in turn and say whether exactly its trigger cells failed, by its oracle."""
    run = MatrixRun.open(args.matrix, strength=args.strength, device=args.device, faults=args.fault or list(FAULTS))
    matrix, goldens, names = run.matrix, run.goldens, sorted(run.faults)
    jobs = jobs_option(args.jobs, run.in_process)
    exact = True
    checks = (check_fault(matrix, name, goldens) for name in names) if jobs == 1 else \
        check_fault_set(matrix, names, goldens, jobs=jobs)
    for name, check in zip(names, checks):
        exact &= check.exact
        verdict = "exact" if check.exact else "NOT EXACT"
        if not check.triggered:
            verdict += " (not exercised: no cell of this matrix triggers it)"
        print(f"{name}: {verdict}; {len(check.triggered)} trigger cells of {check.cells}, {len(check.failed)} failed, "
              f"{len(check.seen_by_oracle)} seen by {FAULTS[name].oracle}; {check.seconds:.1f}s", flush=True)
        for label, cells in (("missed", check.missed), ("spurious", check.spurious), ("wrong oracle", check.wrong_oracle)):
            for cell_id in sorted(cells):
                print(f"  {label}: {cell_id}")
    return 0 if exact else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="print the cells of a matrix and check coverage")
    add_run_options(listing.add_argument, ("matrix", "strength"))
    listing.set_defaults(handler=cmd_list)
    run = sub.add_parser("run", help="run a matrix and write the report")
    add_run_options(run.add_argument, ("matrix", "strength", "inject_fault", "report_dir", "shard", "device"))
    run.add_argument("--resume", action="store_true", help="keep finished cells of the same run in --report-dir "
                     "(refused when the matrix file, faults, strength, device or engine version changed since)")
    run.add_argument("--accept-changed", action="store_true",
                     help="with --resume: keep the finished cells although the run changed (the run header records what)")
    run.add_argument("--cell", action="append", default=[], metavar="ID",
                     help="run only this cell (repeatable); any allowed combination of the matrix's levels")
    run.add_argument("--junit", metavar="FILE", help="also write the cells of this run as JUnit XML (one test case per cell)")
    run.add_argument("--examples-db", metavar="DIR", help="the boundary family's Hypothesis example database, kept "
                     f"between runs: a draw that failed is replayed first (default: REPORT_DIR/{EXAMPLES_DIR})")
    run.add_argument("-j", "--jobs", type=int, metavar="N",
                     help=f"cells side by side in N worker processes (default: ${JOBS_ENV}, else the cores this process may use)")
    run.set_defaults(handler=cmd_run)
    kill = sub.add_parser("kill", help="inject each fault and check it fails exactly its trigger cells")
    add_run_options(kill.add_argument, ("matrix", "strength", "device"))
    kill.add_argument("--fault", action="append", metavar="NAME", help="check only this fault (repeatable)")
    kill.add_argument("-j", "--jobs", type=int, metavar="N",
                      help=f"(fault, cell) runs side by side in N worker processes (default: ${JOBS_ENV}, else the cores)")
    kill.set_defaults(handler=cmd_kill)
    add_table_commands(sub)
    add_triage_commands(sub)
    add_repro_command(sub)
    add_findings_command(sub)
    return parser


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def main(argv: Sequence[str] | None = None) -> int:
    with stop_on_signals():  # SIGTERM and SIGHUP as Ctrl-C: whatever was started is stopped, then 128 + signal
        try:
            args = build_parser().parse_args(argv)
            if getattr(args, "accept_changed", False) and not args.resume:
                raise UsageError("--accept-changed only applies with --resume")
            return args.handler(args)
        except (MatrixError, UnknownFaultError, UnknownEngineError, UsageError, SelectionError, TriageInputError,
                ResumeRefused) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # before the run kept anything (or in a command that keeps nothing)
            signum = signum_of(exc)
            print(f"interrupted by {signal_name(signum)}", file=sys.stderr)
            return 128 + signum
        finally:
            stop_all()  # a group an interrupt caught as it started, before its engine held it
