"""Every relative link in README.md, BENCHMARKS.md and docs/ leads somewhere: the file exists and, where the link
names an anchor (``file.md#section``), a heading of that file has that anchor by GitHub's rules.

A link into BENCHMARKS.md names a section; when a section is renamed or a page moves, this is the test that says
which links still point at the old one.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def without_code_blocks(text: str) -> str:
    """The page with its fenced code blocks cut out: a ``#`` line in a shell block is a comment, not a heading."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the text as rendered (links to their text, code and emphasis marks
    gone), lowercased, every character but letters, digits, marks, ``_``, ``-`` and spaces dropped, spaces to ``-``."""
    text = _INLINE_LINK.sub(r"\1", heading).replace("`", "").lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page; a repeated heading's anchor takes ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in _HEADING.findall(without_code_blocks(text)):
        base = slug(heading.replace("**", "").replace("__", ""))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def shown(path: Path) -> str:
    """``path`` as a reader of the repository names it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file is missing or whose anchor no heading of the target has."""
    broken = []
    for target in _LINK.findall(without_code_blocks(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            broken.append(f"{target} (no heading of {shown(path)} has this anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{shown(page)}: links to nothing: {broken}"


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Covering arrays (`benchmarks/bench_covering.py`)", "covering-arrays-benchmarksbench_coveringpy"),
    ("The report at 5,000 cells", "the-report-at-5000-cells"),
    ("llama.cpp's server", "llamacpps-server"),
    ("`--resume`: going on after a stop", "--resume-going-on-after-a-stop"),
    ("The boundary family (`boundary.py`)", "the-boundary-family-boundarypy"),
    ("[The tutorial](docs/tutorial.md)", "the-tutorial"),
    ("Über-große Zahlen", "über-große-zahlen"),
])
def test_slugs_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_takes_a_number_and_code_blocks_hold_no_headings() -> None:
    page = "# Runs\n\n## Setup\n\n```sh\n# not a heading\n```\n\n## Setup\n\n### Setup\n"
    assert anchors(page) == {"runs", "setup", "setup-1", "setup-2"}


def test_a_link_to_a_missing_file_or_anchor_is_named(tmp_path: Path) -> None:
    (tmp_path / "target.md").write_text("# Target\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](target.md#a-section) [self](#page) [gone](missing.md) [stale](target.md#old-section) "
                    "[web](https://example.com/x#y) ![image](missing.png)\n\n# Page\n")
    assert broken_links(page) == ["missing.md (no such file)",
                                  f"target.md#old-section (no heading of {tmp_path / 'target.md'} has this anchor)",
                                  "missing.png (no such file)"]
