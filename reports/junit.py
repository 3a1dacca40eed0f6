"""JUnit XML of a run (junitparser): one test case per cell, so GPU jobs feed CI test views.

A failing cell is a ``failure`` whose message lists the failing oracles' messages; a cell that
raised is an ``error`` with its traceback; the run header becomes the suite's properties, its host record's facts
among them (``host.cpu_model``, ``host.gpu``, ``host.llamacpp.AMX_INT8``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from harness.results.header import reproduce_command
from harness.results.hosts import facts_of
from harness.results.rows import as_float, error_line

#: characters XML 1.0 cannot carry, even escaped (a traceback may hold any of them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: object) -> str:
    return _NOT_XML.sub("?", str(text))


def _case(row: Mapping, header: Mapping) -> TestCase:
    case = TestCase(_xml_text(row["cell_id"]), _xml_text(f"kvmatrix.{row.get('matrix', 'matrix')}"),
                    as_float((row.get("metrics") or {}).get("wall_seconds")) or 0.0)
    failing = [(name, v.get("message", "")) for name, v in row["oracles"].items() if v["verdict"] == "fail"]
    reproduce = reproduce_command(header, row["cell_id"])
    if row["status"] == "fail":
        result = Failure(_xml_text("; ".join(f"{n}: {m}" for n, m in failing)), "oracle")
        result.text = _xml_text("\n".join([*(f"{n}: {m}" for n, m in failing), "", f"reproduce: {reproduce}"]))
        case.result = [result]
    elif row["status"] == "error":
        result = Error(_xml_text(error_line(row.get("error")) or "error"), "error")
        result.text = _xml_text(f"{row.get('error') or ''}\n\nreproduce: {reproduce}")
        case.result = [result]
    elif row["status"] == "xpass":  # strict, as pytest's xfail(strict=True): a declared failure that passed
        expected = row.get("expected") or {}
        result = Failure(_xml_text(f"xpass: declared to fail {', '.join(expected.get('fails', []))} "
                                   f"({expected.get('reason', '')}) and passed"), "xpass")
        result.text = _xml_text(f"reproduce: {reproduce}")
        case.result = [result]
    elif row["status"] == "xfail":  # pytest's own JUnit writes an xfail as skipped with its reason
        expected = row.get("expected") or {}
        case.result = [Skipped(_xml_text(f"xfail: {', '.join(expected.get('fails', []))}: {expected.get('reason', '')}"))]
    elif row["status"] == "skip":
        case.result = [Skipped("skipped")]
    return case


def host_properties(header: Mapping) -> dict[str, str]:
    """The host facts of a run header (``machine``; ``cpu_flags`` is a property of its own) as JUnit properties:
    ``host.NAME``, an engine's as ``host.ENGINE.NAME``; a fact there is none of (no GPU) is "none"."""
    if not isinstance(header.get("machine"), Mapping):
        return {}
    return {"host." + name.replace(" ", ".", 1): "none" if value is None else str(value)
            for name, value in facts_of({"machine": header["machine"]}).items() if name != "cpu_flags"}


def write_junit(path: Path, rows: Sequence[Mapping], runs: Sequence[Mapping]) -> None:
    """Write ``rows`` as one JUnit test suite per matrix to ``path``."""
    by_run = {r["run_id"]: r for r in runs}
    xml = JUnitXml("kvmatrix")
    suites: dict[str, TestSuite] = {}
    for row in rows:
        matrix = str(row.get("matrix", "matrix"))
        header = by_run.get(row.get("run_id", ""), runs[0] if runs else {"matrix": matrix, "faults": row.get("faults", [])})
        if matrix not in suites:
            suites[matrix] = TestSuite(_xml_text(f"kvmatrix.{matrix}"))
            for key in ("matrix_sha256", "mode", "strength", "faults", "device", "device_name", "cpu_flags", "shard", "commit",
                        "date", "host", "command"):
                suites[matrix].add_property(key, _xml_text(header.get(key, "")))
            for key, value in host_properties(header).items():
                suites[matrix].add_property(key, _xml_text(value))
        suites[matrix].add_testcase(_case(row, header))
    for suite in suites.values():
        suite.update_statistics()
        xml.add_testsuite(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(path), pretty=True)
