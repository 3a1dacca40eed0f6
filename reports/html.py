"""Render pages: the run's index.html (and compare.html), each with its stylesheet beside it.

The pages carry no script and load nothing from the network. Styling comes twice, on purpose:
an inline ``<style>`` whose SHA-256 the page's own Content-Security-Policy allows (so a lone
index.html opened from disk looks right), and ``report.css`` beside it, for CI viewers whose
policy forbids inline styles (Jenkins' default: ``default-src 'none'; style-src 'self'``).
Without either, the page is plain HTML that still reads top to bottom: headings, tables,
``<details>`` toggles and ``<mark>`` for what differs.
"""
from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import jinja2

from harness.results.compare import Comparison
from harness.results.files import INDEX
from harness.results.rows import write_atomic
from reports.page import filter_css, index_context

CSS_NAME = "report.css"
_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("reports", "templates"),
    autoescape=True,  # every template, whatever its name: each value from a results file is data, never markup
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
)


def base_css() -> str:
    """The stylesheet every page shares."""
    return resources.files("reports").joinpath("templates", CSS_NAME).read_text(encoding="utf-8")


def csp(css: str) -> str:
    """The page's Content-Security-Policy: nothing but same-origin images and its own stylesheets."""
    digest = base64.b64encode(hashlib.sha256(css.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; img-src 'self'; style-src 'self' 'sha256-{digest}'; base-uri 'none'; "
            "form-action 'none'")


def render(template: str, css: str, css_name: str = CSS_NAME, **context: object) -> str:
    """A page from ``template`` with ``css`` inline (allowed by its CSP) and linked as ``css_name`` beside it."""
    return _ENV.get_template(template).render(css=css, csp=csp(css), css_name=css_name, **context)


def index_page(rows: Sequence[Mapping], summary: Mapping, probes: Sequence[Mapping] = (),
               report_dir: str = "DIR", *, kinds: Mapping[str, str]) -> tuple[str, str]:
    """index.html and its stylesheet for a run's rows, written to ``report_dir``, each oracle's findings shown as the
    kind of view ``kinds`` names (``page.index_context``)."""
    context = index_context(rows, summary, probes, report_dir, kinds=kinds)
    css = base_css() + filter_css(context["factors"], context["levels"], context["oracles"])
    return render("index.html", css, **context), css


def write_report(directory: Path, rows: Sequence[Mapping], summary: Mapping, probes: Sequence[Mapping] = (), *,
                 kinds: Mapping[str, str]) -> None:
    """index.html and report.css into ``directory``, each oracle's findings shown as the kind of view ``kinds`` names
    (with ``kinds`` bound, a ``Render`` for ``harness.results.store.ResultsStore``)."""
    directory.mkdir(parents=True, exist_ok=True)
    page, css = index_page(rows, summary, probes, str(directory), kinds=kinds)
    write_atomic(directory / CSS_NAME, css)
    write_atomic(directory / INDEX, page)


def write_compare(path: Path, comparison: Comparison, base_name: str, new_name: str) -> None:
    """compare.html (and compare.css beside it) for two runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    css = base_css()
    css_path = path.with_suffix(".css")
    page = render("compare.html", css, css_path.name, c=comparison, base_name=base_name, new_name=new_name)
    write_atomic(css_path, css)
    write_atomic(path, page)
