"""The report's boundary section: for every cell that drew the boundary family, its seams and the shapes each draw
held, which failed, and the shrunk draw that stands for the failure (``metrics.boundary``, harness/run/boundary.py)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def _verdict(draw: Mapping) -> str:
    """``pass``, the failing checks, or the line a reference raised."""
    if draw.get("failed"):
        return "fail: " + ", ".join(draw["failed"])
    return f"reference raised: {draw['error']}" if draw.get("error") else "pass"


def boundary_cells(rows: Sequence[Mapping], table: Mapping[str, str]) -> list[dict]:
    """Each cell that drew, in row order: its row anchor, status, seams, draws (name, phase, shapes, verdict) and the
    shrunk draw, if one failed."""
    out = []
    for row in rows:
        found = (row.get("metrics") or {}).get("boundary")
        if not isinstance(found, Mapping):
            continue
        seams = found.get("seams") or {}
        shrunk = found.get("shrunk")
        out.append({
            "cell_id": row["cell_id"], "row_id": table.get(row["cell_id"]), "status": row["status"],
            "seams": f"B {seams.get('page')}, budget {seams.get('budget')}, k {seams.get('k')}, "
                     f"context {seams.get('context') or 'any'}, cap {seams.get('max_tokens')}",
            "draws": [{"name": d.get("name"), "phase": d.get("phase"), "shapes": d.get("shapes") or [],
                       "verdict": _verdict(d), "failed": bool(d.get("failed"))} for d in found.get("draws") or []],
            "shrunk": None if not isinstance(shrunk, Mapping) else {
                "name": shrunk.get("name"), "shapes": shrunk.get("shapes") or [], "verdict": _verdict(shrunk),
                "requests": shrunk.get("requests"), "prompt_tokens": shrunk.get("prompt_tokens") or []},
            "shrink_runs": found.get("shrink_runs", 0), "saved": found.get("saved", 0), "seconds": found.get("seconds"),
        })
    return out
