"""A report with failures, rendered by headless Chromium (Debian's chromium): what a person's browser builds from it."""
from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reports.html import write_report
from harness.oracles import evidence_kinds
from harness.results.reader import summarize
from tests import report_rows
from tests.binaries import required_binary

#: as the machine notes say Debian's chromium runs headless here: no sandbox (root), no network chatter.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--enable-logging=stderr"]
PAYLOAD = "<script>document.title='pwned'</script>"


def test_a_missing_chromium_fails_under_ci_and_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        required_binary("chromium", "the browser check")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        required_binary("chromium", "the browser check")


class Dom(HTMLParser):
    """Tags, ids and fragment links of a serialized DOM, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.links: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        if (found.get("href") or "").startswith("#"):
            self.links.add(found["href"][1:])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_headless_chromium_renders_the_located_combination_and_anchors(tmp_path: Path) -> None:
    binary = required_binary("chromium", "the browser check")
    rows = report_rows.rows(300, seed=2)
    rows[0]["factors"]["model"] = rows[0]["cell_id"] = PAYLOAD  # data that looks like markup stays text
    runs = [report_rows.header(command=PAYLOAD)]
    write_report(tmp_path / "report", rows, summarize(rows, runs, len(rows)), kinds=evidence_kinds())
    done = subprocess.run([binary, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           (tmp_path / "report" / "index.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Dom()
    dom.feed(done.stdout)
    text = "".join(dom.text)
    what_fails = text[text.index("What fails"): text.index("Failure rate, factor")]
    assert "pool=unified & backend=triton & deterministic=on" in what_fails
    assert "script" not in dom.tags and PAYLOAD in text  # shown, never run
    assert "svg" in dom.tags and "details" in dom.tags
    cells = {link for link in dom.links if link.startswith("cell-")}
    assert cells and cells <= dom.ids  # every cell link lands on an element
    assert "Content Security Policy" not in done.stderr  # the inline stylesheet's hash matches the page's policy
