"""Render a run's results as one self-contained HTML page (no network, no scripts needed)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import jinja2

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("reports", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    keep_trailing_newline=True,
)


def render_index(records: Sequence[dict], summary: dict) -> str:
    """The cells × oracles table, failures first, with each failing verdict's evidence."""
    oracles = sorted({name for r in records for name in r.get("oracles", {})}, key=_oracle_order)
    factors: list[str] = []
    for record in records:
        factors.extend(f for f in record["factors"] if f not in factors)
    order = {"error": 0, "fail": 1, "pass": 2, "skip": 3}
    rows = sorted(records, key=lambda r: (order.get(r["status"], 9), r["cell_id"]))
    return _ENV.get_template("index.html").render(
        summary=summary, rows=rows, oracles=oracles, factors=factors,
        pretty=lambda value: json.dumps(value, indent=1, default=str),
    )


def _oracle_order(name: str) -> tuple[int, str]:
    known = ["tokens", "logprobs", "nan", "accept_length", "cached_tokens", "batch_invariance", "completeness", "pool_audit"]
    return (known.index(name) if name in known else len(known), name)


def write_index(path: Path, records: Sequence[dict], summary: dict) -> None:
    """Write index.html atomically (a reader never sees half a page)."""
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_index(records, summary), encoding="utf-8")
    tmp.replace(path)
