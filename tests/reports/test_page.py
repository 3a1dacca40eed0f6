"""The report page: located combinations, evidence views, escaping of every field, a strict CSP."""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest

from reports import evidence
from reports.html import index_page
from harness.oracles import evidence_kinds
from harness.results.locate import analyze
from harness.results.reader import summarize
from tests import recorded_hosts, report_rows

PAYLOAD = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    return report_rows.rows(400, seed=1)


def page(rows: list[dict], runs: list[dict] | None = None, probes: list[dict] = ()) -> str:
    runs = [report_rows.header()] if runs is None else runs
    return index_page(rows, summarize(rows, runs, len(rows)), probes, kinds=evidence_kinds())[0]


def test_analysis_pins_every_rule_of_the_full_product() -> None:
    classes = {c.name: c for c in analyze(report_rows.rows())}
    expected = {"tokens": report_rows.RULES["tokens"], "completeness": report_rows.RULES["completeness"],
                "accept_length": report_rows.RULES["accept_length"], "error: IndexError": report_rows.RULES["error"]}
    assert set(classes) == set(expected)
    for name, rule in expected.items():
        (finding,) = classes[name].findings
        assert classes[name].pinned and finding.combination.as_dict() == {f: (v,) for f, v in rule.items()}, name
        assert len(finding.cells) == len(classes[name].failing)


def test_merged_levels_and_unexplained_cells() -> None:
    rows = [{"cell_id": f"{a}-{b}", "factors": {"spec": a, "cache": b}, "status": "fail" if (a, b) in bad else "pass",
             "oracles": {"x": {"verdict": "fail" if (a, b) in bad else "pass"}}}
            for bad in [{("draft", "device"), ("mtp", "device")}] for a in ("none", "draft", "mtp") for b in ("off", "device")]
    (cls,) = analyze(rows)
    assert [f.combination.text() for f in cls.findings] == ["spec∈{draft, mtp} & cache=device"] and cls.pinned
    rows.append({**rows[0], "cell_id": "flaky", "status": "fail", "oracles": {"x": {"verdict": "fail"}}})
    assert analyze(rows)[0].unexplained == ["flaky"]


def test_page_says_what_fails_at_the_top_with_anchors(sample: list[dict]) -> None:
    html = page(sample)
    top = html[: html.index('id="grid"')]
    assert "error: IndexError" in top and "model=hybrid &amp; spec=mtp" in top and "pinned down" in top
    targets = set(re.findall(r'href="#(cell-[^"]+)"', html))
    ids = set(re.findall(r'id="(cell-[^"]+)"', html))
    assert targets and targets <= ids
    assert "<svg" in html and "cells fail</title>" in html  # the grid, with counts per square


def test_evidence_views_of_each_kind(sample: list[dict]) -> None:
    html = page(sample)
    assert '<td class="first"><b>' in html and "<mark>" in html  # tokens aligned, first divergence marked
    assert "accept length histogram" in html
    assert "python -m harness run --matrix synthetic --device cpu --cell " in html
    assert "<details><summary>raw JSON</summary>" in html


def test_token_diff_aligns_and_marks_the_first_divergence() -> None:
    columns = evidence.token_diff({"step": 3, "window_start": 1, "expected_tokens": [1, 2, 3, 4], "got_tokens": [1, 2, 9]})
    assert [(c.step, c.expected, c.got, c.differs, c.first) for c in columns] == [
        (1, 1, 1, False, False), (2, 2, 2, False, False), (3, 3, 9, True, True), (4, 4, None, True, False)]


def test_bitwise_difference_of_two_logprobs() -> None:
    one = 0.5
    next_up = 0.5000000596046448  # the float32 after 0.5
    diff = evidence.bitwise(one, next_up)
    assert diff["width"] == 32 and diff["ulps"] == 1 and diff["bits_differ"] == 1 and diff["xor"] == "00000001"
    assert evidence.bitwise(-0.5, "NaN")["got"]["hex"] == "nan"
    assert evidence.bitwise([1], [2]) is None


def test_tier_table_and_accept_bars() -> None:
    table = evidence.tier_table({"expected_tiers": {"total": [48, 48], "host": 16, "storage": 0},
                                 "got_tiers": {"total": 48, "device": 48, "host": 0, "storage": 0}})
    assert [(t["tier"], t["expected"], t["got"], t["ok"]) for t in table] == [
        ("device", 32, 48, False), ("host", 16, 0, False), ("storage", 0, 0, True), ("total", 48, 48, True)]
    bars = evidence.accept_bars({"histogram": {"1": 30, "4": 3}, "expected_histogram": {"4": 30}})
    assert [(b["length"], b["got_px"], b["expected_px"]) for b in bars] == [(1, 60, 0), (4, 6, 60)]


def string_leaves(value: object, path: tuple = ()) -> Iterator[tuple]:
    """Every place data can put a string: each value and each key that is not the schema's own (status excepted)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if path and not (len(path) == 2 and path[0] == "oracles"):
                yield (*path, ("key", key))
            yield from string_leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_leaves(item, (*path, i))
    elif isinstance(value, str) and path[-1:] not in (("status",), ("verdict",)):
        yield path


def poisoned(row: dict, where: tuple) -> dict:
    row = copy.deepcopy(row)
    *parents, last = where
    target = row
    for step in parents:
        target = target[step]
    if isinstance(last, tuple):  # a dict key
        target[PAYLOAD + last[1]] = target.pop(last[1])
    else:
        target[last] = PAYLOAD
    return row


def test_every_field_is_escaped(sample: list[dict]) -> None:
    """XSS: the payload in any key or string of a failing row, of a passing row or of the run header stays text."""
    failing = next(r for r in sample if r["status"] == "fail" and "tokens" in r["oracles"]
                   and r["oracles"]["tokens"]["verdict"] == "fail")
    erroring = next(r for r in sample if r["status"] == "error")
    passing = next(r for r in sample if r["status"] == "pass")
    cases = [("row", r, w) for r in (failing, erroring, passing) for w in string_leaves(r)]
    cases += [("header", report_rows.header(), w) for w in string_leaves(report_rows.header())]
    assert len(cases) > 100
    for kind, base, where in cases:
        rows = [poisoned(r, where) if (kind == "row" and r is base) else r for r in (failing, erroring, passing)]
        runs = [poisoned(base, where)] if kind == "header" else None
        html = page(rows, runs, probes=[{**poisoned(failing, where), "probe": {"of": PAYLOAD, "changed": PAYLOAD}}]
                    if kind == "row" else ())
        assert "<script" not in html and "<img" not in html and "onerror=alert" not in html.replace("onerror=alert(2)&gt;", ""), (kind, where)


def test_strict_content_security_policy_and_no_script(sample: list[dict]) -> None:
    html = page(sample[:50])
    (policy,) = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
    policy = policy.replace("&#39;", "'")
    assert "default-src 'none'" in policy and "script-src" not in policy and "'unsafe-inline'" not in policy
    assert re.search(r"style-src 'self' 'sha256-[A-Za-z0-9+/=]+'", policy)
    assert '<link rel="stylesheet" href="report.css">' in html and "<script" not in html


def test_engine_findings_and_harness_limitations_are_listed_apart(sample: list[dict]) -> None:
    """Each declaration the cells matched once, under its class, with its upstream status and what it excused."""
    bug = {"number": 1, "when": {"spec": ["draft"]}, "fails": ["logprobs"], "reason": "drafted tokens read 0.0",
           "signature": {"got": [0.0], "token": ["drafted"]}, "class": "engine bug",
           "upstream": "ggml-org/llama.cpp#27972", "seen_on": "llama.cpp 0c1e570"}
    limit = {"number": 2, "when": {"cache": ["device"]}, "fails": ["cached_tokens"], "reason": "not read back",
             "signature": {"got": ["0"]}, "class": "harness limitation", "upstream": "none: the engine's own choice",
             "seen_on": "SGLang 0.5.23"}
    rows = copy.deepcopy(sample[:40])
    for row, declarations, excused in ((rows[0], [bug], 3), (rows[1], [bug, limit], 2)):
        row["status"] = "xfail"
        row["expected"] = {"when": [], "fails": [], "reason": "", "declarations": declarations}
        row["oracles"]["logprobs"] = {"verdict": "pass", "message": "excused", "detail": [], "excused": {"1": excused}}
    html = page(rows)
    section = html[html.index('id="declared"'): html.index('id="grid"')]
    engine = section[section.index("Engine findings"): section.index("Harness limitations")]
    harness = section[section.index("Harness limitations"):]
    assert "ggml-org/llama.cpp#27972" in engine and "2 cell(s) (xfail 2), 5 finding(s) excused" in engine
    assert "got = 0.0, token = drafted" in engine and "not read back" not in engine
    assert "none: the engine&#39;s own choice" in harness and "1 cell(s) (xfail 1), 0 finding(s) excused" in harness
    assert "27972" not in harness
    assert 'id="declared"' not in page(sample[:40])  # nothing declared: no section
    untriaged = {"number": 3, "when": {}, "fails": ["error: TypeError"], "reason": "declared before the re-triage"}
    rows[2]["expected"] = {"when": [], "fails": [], "reason": "", "declarations": [untriaged]}
    html = page(rows)
    assert "Not yet triaged" in html and "upstream: not stated" in html


def test_each_failing_or_xfail_cell_shows_its_repro_command(sample: list[dict]) -> None:
    """A cell ``harness repro`` writes a script for (fail, error, xfail) shows the command with the report's directory;
    an xpass or passing cell shows none."""
    rows = copy.deepcopy(sample[:40])
    failing = [row for row in rows if row["status"] in ("fail", "error")]
    assert failing
    rows[0]["status"], xpass = "xfail", next(row for row in rows[1:] if row["status"] == "pass")
    xpass["status"] = "xpass"
    html = index_page(rows, summarize(rows, [report_rows.header()], len(rows)), report_dir="reports/run 1",
                      kinds=evidence_kinds())[0]
    shown = set(re.findall(r"python -m harness repro &#39;reports/run 1&#39; --cell ([^<\s]+)</code>", html))
    assert {rows[0]["cell_id"], *(row["cell_id"] for row in failing)} <= shown
    assert xpass["cell_id"] not in shown
    assert not shown - {row["cell_id"] for row in rows if row["status"] in ("fail", "error", "xfail")}


def test_the_run_table_shows_each_hosts_record_and_names_what_differs_between_hosts() -> None:
    """Shards of one matrix on the recorded EPYC and AMX Xeon (tests/recorded_hosts.py): each column shows its CPU,
    cores, GPU and llama.cpp's build, and the page says what the second host differs in; one host, no section."""
    runs = [recorded_hosts.header("run-e", "epyc"), recorded_hosts.header("run-x", "xeon_amx")]
    rows = [recorded_hosts.row(recorded_hosts.CELLS[0], "pass", "run-e"), recorded_hosts.row(recorded_hosts.CELLS[1],
                                                                                            "pass", "run-x")]
    html = page(rows, runs)
    table = html[html.index('<h2 id="run">'):]
    assert "<tr><td>cpu_model</td><td>AMD EPYC 9B14</td><td>Intel(R) Xeon(R) Processor</td></tr>" in table
    assert "<tr><td>cores</td><td>2</td><td>2</td></tr>" in table and "<tr><td>gpu</td><td>–</td><td>–</td></tr>" in table
    build = re.search(r"<tr><td>engine_build</td><td>(.*?)</td><td>(.*?)</td></tr>", table)
    assert "AMX_INT8" not in build.group(1) and "AVX512 1" in build.group(1) and "AMX_INT8 1" in build.group(2)
    hosts = html[html.index('<h2 id="hosts">'):html.index('<h2 id="run">')]
    assert "run <code>run-x</code>: cpu_model AMD EPYC 9B14 → Intel(R) Xeon(R) Processor, cpu_flags +avx512_fp16" in hosts
    assert "llamacpp AMX_INT8 none → 1" in hosts
    assert 'id="hosts"' not in page(rows[:1], runs[:1])
    gpu = {**runs[1], "machine": {**runs[1]["machine"], "gpu": {"name": "NVIDIA H100", "capability": "9.0",
                                                                  "driver": "550.54.15", "cuda": "12.4"}}}
    assert "NVIDIA H100, compute 9.0, driver 550.54.15, CUDA 12.4" in page(rows[1:], [gpu])


def test_every_view_an_oracle_declares_is_one_the_report_draws() -> None:
    kinds = evidence_kinds()
    assert set(kinds.values()) <= set(evidence.KINDS), kinds
    assert kinds["tokens"] == "tokens" and "completeness" not in kinds  # a declared view, and the table by default
