"""``harness findings``: the findings under ``findings/`` as data. It writes each folder's REPORT.md and repro.py
(git-ignored) from its finding.json and notes.md, and the engine-bug lists of README.md and docs/how-to/vllm.md
(committed) from every finding; ``--check`` writes nothing and exits 1 naming each finding that does not render and
each list that differs (a hand edit, or a finding changed and not rendered yet); ``--lists`` prints the lists."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.repro.lists import FINDINGS, ROOT, TARGETS, ListError, list_text, listed, stale
from harness.repro.report import FINDING, render, write_rendered


def folders(names: list[str], root: Path = FINDINGS) -> list[Path]:
    """The finding folders named (a name or a path), every one under ``root`` when none is."""
    if not names:
        return sorted(path.parent for path in root.glob("*/finding.json"))
    chosen = [Path(name) if Path(name).is_dir() else root / name for name in names]
    missing = [str(path) for path in chosen if not (path / "finding.json").is_file()]
    if missing:
        raise SystemExit(f"findings: no finding.json in {', '.join(missing)}")
    return chosen


def unrenderable(folder: Path) -> str | None:
    """Why ``folder``'s finding does not render (its finding.json unreadable or missing a field); None when it does."""
    try:
        render(folder)
    except (ValueError, KeyError, TypeError) as exc:
        return f"{folder / FINDING}: does not render: {type(exc).__name__}: {exc}"
    return None


def cmd_findings(args: argparse.Namespace) -> int:
    if args.lists:
        for target in TARGETS:
            print(f"{target.path}:\n{list_text(listed(), target)}\n")
        return 0
    chosen = folders(args.names)
    try:
        lists_stale = stale(ROOT, write=not args.check)
    except ListError as exc:
        print(f"findings: {exc}", file=sys.stderr)
        return 2
    if args.check:
        problems = [why for why in map(unrenderable, chosen) if why is not None]
        problems += [f"{path}: differs from what the findings render (run python -m harness findings)"
                     for path in lists_stale]
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    for folder in chosen:
        for path in write_rendered(folder):
            print(path)
    for path in lists_stale:
        print(f"{path}: its findings list rewritten")
    return 0


def add_findings_command(sub: argparse._SubParsersAction) -> None:
    """Add ``findings`` to the ``python -m harness`` parser."""
    findings = sub.add_parser("findings", help="render each finding's REPORT.md and repro.py from its data, and the "
                              "engine-bug lists of README.md and docs/how-to/vllm.md")
    findings.add_argument("names", nargs="*", metavar="FINDING", help="folders or names (default: every one)")
    mode = findings.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each finding that does "
                      "not render and each list that differs from what the findings render")
    mode.add_argument("--lists", action="store_true", help="print the engine-bug lists and write nothing")
    findings.set_defaults(handler=cmd_findings)
