"""A finding folder: ``repro.py`` (the engine's writer), ``REPORT.md`` in the shape of an engine's bug template (what,
how to reproduce, expected, actual, environment, cause where known, upstream status), ``finding.json`` (the same in
plain values), and, where the script was run at once, ``output.txt``, what it printed."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness import oracles
from harness.repro.finding import Reproducer
from harness.repro.scripts import ScriptWriter, writer_for
from harness.repro.scripts.text import environment
from harness.results.rows import dumps, error_line
from reference_impl.faults import FAULTS

SCRIPT, REPORT, FINDING, OUTPUT = "repro.py", "REPORT.md", "finding.json", "output.txt"


@dataclass(frozen=True, slots=True)
class Ran:
    """What the script did when ``harness repro`` ran it: its exit status and output."""

    status: int
    output: str

    def line(self, prefix: str) -> str:
        """The output's line that starts with ``prefix`` (``expected:``), without it; "" when none does."""
        found = next((line for line in self.output.splitlines() if line.startswith(prefix)), "")
        return found[len(prefix):].strip()


def run_script(writer: ScriptWriter, script: Path, timeout: float) -> Ran:
    """Run ``script`` as its header says, with the engine's interpreter, from its folder."""
    command = writer.command(script)
    argv = [writer.python(), *command.argv[1:]] if command.argv[0] == "python" else list(command.argv)
    done = subprocess.run(argv, cwd=script.parent, env={**os.environ, **command.env}, capture_output=True, text=True,
                          timeout=timeout)
    return Ran(done.returncode, done.stdout + done.stderr)


def _finding(repro: Reproducer) -> dict:
    """The harness's first finding of the check on the shrunk workload (the error's last line for an error)."""
    if repro.check.oracle == "error":
        return {"error": error_line(repro.failing.error)}
    found = repro.check.findings(repro.failing)
    return found[0] if found else {}


def _cause(repro: Reproducer) -> tuple[str, str]:
    """(cause, upstream status) where known: the planted fault's incident, or the matrix's declaration."""
    planted = [FAULTS[name] for name in sorted(repro.plan.faults) if name in FAULTS]
    if planted:
        return (" ".join(f"The planted fault `{f.name}`: {f.doc} (triggers: {dict(f.triggers)})" for f in planted),
                " ".join(f"Modelled on {f.incident}." for f in planted))
    declarations = (repro.row.get("expected") or {}).get("declarations", [])
    if declarations:
        return (" ".join(d.get("reason", "") for d in declarations),
                "; ".join(f"{d.get('upstream', 'not reported')} (seen on {d.get('seen_on', '?')})"
                          for d in declarations))
    return "Unknown: to be filled in by hand.", "Not reported."


def report_text(repro: Reproducer, writer: ScriptWriter, script: Path, ran: Ran | None) -> str:
    """``REPORT.md``."""
    toggle, check, size = repro.toggle, repro.check, repro.shrunk.after
    finding = _finding(repro)
    expected = (ran.line("expected:") if ran else "") or str(finding.get("expected", "no exception"))
    actual = (ran.line("got:") if ran else "") or str(finding.get("got", finding.get("problem", finding.get("error"))))
    cause, upstream = _cause(repro)
    fails_when = oracles.oracles()[check.oracle].fails_when if check.oracle in oracles.oracles() else "the cell raises"
    lines = [
        f"# {check.text()} fails with {toggle.factor}={toggle.level} ({writer.engine})", "",
        "## What",
        f"With `{toggle.factor}={toggle.level}` the `{check.text()}` check fails; with "
        f"`{toggle.factor}={toggle.golden}` (its golden level), all else equal, it passes. The check fails when "
        f"{fails_when}.", "",
        "## How to reproduce",
        f"`{SCRIPT}` is standalone (no kvmatrix import): it sends {size.requests} request(s) ({size.prompt_tokens} "
        f"prompt tokens, {size.decoded_tokens} decoded) cold then warm, once per setting, and exits 1 while the bug "
        "is present, 0 once fixed.", "", "```", writer.command(script).text(), "```", "",
        "## Expected", expected, "", "## Actual", actual, "",
        "## Environment", *(f"- {line}" for line in environment(*writer.environment())), "",
        "## Cause", cause, "", "## Upstream status", upstream, "",
        "## Shrink", f"{repro.shrunk.text()} (each run: the cell and, shrinking, the toggled cell, on the engine).", "",
        "## Provenance",
        f"Cell `{repro.row['cell_id']}` ({repro.row['status']}) of run `{repro.header.get('run_id', '?')}`, matrix "
        f"`{repro.header.get('matrix', '?')}`; written by `{repro.command()}`.",
        *([f"The script exited {ran.status} when written."] if ran else []), "",
    ]
    return "\n".join(lines)


def write_finding(repro: Reproducer, out: Path, verify: bool = True) -> tuple[Path, Ran | None]:
    """Write ``repro``'s folder at ``out``; run its script where ``verify``."""
    writer = writer_for(repro.plan.engine, repro.plan.engine_args)
    out.mkdir(parents=True, exist_ok=True)
    script = out / SCRIPT
    script.write_text(writer.script(repro, script.resolve()))
    script.chmod(0o755)
    ran = run_script(writer, script, timeout=max(60.0, 3 * repro.plan.timeout_s)) if verify else None
    if ran is not None:
        (out / OUTPUT).write_text(ran.output)
    (out / REPORT).write_text(report_text(repro, writer, script.resolve(), ran))
    finding = {"cell_id": repro.row["cell_id"], "status": repro.row["status"], "run_id": repro.header.get("run_id"),
               "matrix": repro.header.get("matrix"), "engine": writer.engine, "check": repro.check.text(),
               "toggle": {"factor": repro.toggle.factor, "level": repro.toggle.level, "golden": repro.toggle.golden},
               "faults": sorted(repro.plan.faults), "shrink": repro.shrunk.to_json(), "finding": _finding(repro),
               "script_exit": None if ran is None else ran.status, "command": repro.command()}
    (out / FINDING).write_text(json.dumps(json.loads(dumps(finding)), indent=2) + "\n")
    return script, ran
