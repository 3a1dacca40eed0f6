"""The report's "Boundary draws" section (issue 42): each cell that drew, its seams, every draw's shapes and verdict,
and the shrunk draw that failed; absent where no cell drew."""
from __future__ import annotations

import copy

from harness.oracles import evidence_kinds
from harness.results.reader import summarize
from reports.html import index_page
from tests import report_rows

DRAWN = {"settings": {"draws": 2, "shrink_runs": 40, "shapes": 4, "max_tokens": 256},
         "seams": {"page": 16, "budget": 128, "k": 0, "context": None, "vocab": 256, "max_tokens": 256},
         "seed": 1, "database": "/r/hypothesis", "saved": 1,
         "draws": [{"name": "boundary-1", "phase": "replay", "shapes": ["pages B (16)", "one at a time"], "requests": 1,
                    "prompt_tokens": [16], "failed": ["cached_tokens"], "draw": {}},
                   {"name": "boundary-2", "phase": "draw", "shapes": ["prefix 2B-1 (31)", "batched"], "requests": 2,
                    "prompt_tokens": [40, 40], "failed": [], "draw": {}}],
         "shrunk": {"name": "boundary-1", "phase": "replay", "shapes": ["pages B <16>", "one at a time"],
                    "requests": 1, "prompt_tokens": [16], "failed": ["cached_tokens"], "draw": {}},
         "shrink_runs": 3, "seconds": 1.5}


def _page(rows: list[dict]) -> str:
    return index_page(rows, summarize(rows, [report_rows.header()], len(rows)), (), kinds=evidence_kinds())[0]


def test_the_section_shows_each_cells_draws_and_the_shrunk_one() -> None:
    rows = copy.deepcopy(report_rows.rows(8, seed=3))
    rows[2]["metrics"]["boundary"] = DRAWN
    html = _page(rows)
    section = html[html.index('id="boundary"'):html.index('id="cells"')]
    assert rows[2]["cell_id"] in section and "B 16, budget 128, k 0, context any, cap 256" in section
    assert "boundary-1 (replay): pages B (16); one at a time · <mark>fail: cached_tokens</mark>" in section
    assert "boundary-2 (draw): prefix 2B-1 (31); batched · pass" in section
    assert "pages B &lt;16&gt;" in section and "1 request(s), prompts 16; 3 shrink run(s)" in section
    assert "1 draw(s) replayed from the example database" in section


def test_no_section_where_no_cell_drew() -> None:
    assert 'id="boundary"' not in _page(copy.deepcopy(report_rows.rows(8, seed=3)))
