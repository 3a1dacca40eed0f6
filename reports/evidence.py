"""Evidence as diffs: an oracle's findings turned into what a person compares (tokens, tiers, bits, bars).

Each function takes one finding (a dict of an oracle's ``detail``, as results.jsonl holds it)
and returns a small view model the page template draws. Which view an oracle's findings get is its declaration's
(``Oracle.evidence``, a key of ``KINDS``), handed in by the entry points (``reports/`` reads no oracle); no kind, or
findings of another shape, fall back to a key/value table, so an older results file still renders.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from harness.results.rows import as_float

BAR_HEIGHT = 60


@dataclass(frozen=True, slots=True)
class TokenColumn:
    """One position of the aligned sequences."""

    step: int
    expected: object
    got: object
    differs: bool
    first: bool


def token_diff(finding: Mapping) -> list[TokenColumn]:
    """Golden and cell tokens aligned by step, differing steps flagged, the first divergence marked."""
    step = finding.get("step", 0)
    start = finding.get("window_start", step)
    expected, got = list(finding.get("expected_tokens", [])), list(finding.get("got_tokens", []))
    n = max(len(expected), len(got))
    pad = [None] * n
    return [TokenColumn(start + i, (expected + pad)[i], (got + pad)[i], (expected + pad)[i] != (got + pad)[i],
                        start + i == step) for i in range(n)]


def float_bits(value: object, width: int | None = None) -> dict | None:
    """A float's exact text, hex and bit pattern: float32 when it is one (as every fp32 logprob is), else float64."""
    x = as_float(value)
    if x is None:
        return None
    if width is None:
        width = 32 if not math.isfinite(x) or struct.unpack("<f", struct.pack("<f", x))[0] == x else 64
    fmt, uint = ("<f", "<I") if width == 32 else ("<d", "<Q")
    bits = struct.unpack(uint, struct.pack(fmt, x))[0]
    return {"text": repr(x), "hex": x.hex() if math.isfinite(x) else str(x), "bits": f"{bits:0{width // 4}x}",
            "value": bits, "width": width}


def bitwise(expected: object, got: object) -> dict | None:
    """How two floats differ bit for bit: both bit patterns, the differing bits, the distance in units of last place."""
    a, b = float_bits(expected), float_bits(got)
    if a is None or b is None:
        return None
    width = max(a["width"], b["width"])
    a, b = float_bits(expected, width), float_bits(got, width)
    xor = a["value"] ^ b["value"]
    return {"expected": a, "got": b, "width": width, "xor": f"{xor:0{width // 4}x}", "bits_differ": bin(xor).count("1"),
            "ulps": _ordered(b["value"], width) - _ordered(a["value"], width)}


def _ordered(bits: int, width: int) -> int:
    """Map a float's bit pattern to an integer that is monotonic in the float's value (for ULP distances)."""
    sign = 1 << (width - 1)
    return (sign - (bits & (sign - 1))) if bits & sign else bits + sign


def tier_table(finding: Mapping) -> list[dict]:
    """Cached tokens expected vs got per tier (device, host, storage, total); None where the tier is free."""
    expected, got = finding.get("expected_tiers"), finding.get("got_tiers")
    if not isinstance(expected, Mapping) or not isinstance(got, Mapping):
        return []
    lo, hi = (expected.get("total") or [None, None])[:2]
    host, storage = expected.get("host"), expected.get("storage")
    exact_device = lo - (host or 0) - (storage or 0) if lo == hi and lo is not None and None not in (host, storage) else None
    want = {"device": exact_device, "host": host, "storage": storage, "total": lo if lo == hi else f"{lo}..{hi}"}
    rows = []
    for tier in ("device", "host", "storage", "total"):
        w, g = want[tier], got.get(tier)
        ok = w is None or (g == w if not isinstance(w, str) else lo <= g <= hi)
        rows.append({"tier": tier, "expected": "any" if w is None else w, "got": g, "ok": ok})
    return rows


def accept_bars(finding: Mapping) -> list[dict]:
    """Accept-length histograms (got vs expected) as bar heights in pixels, one entry per accept length."""
    got, want = finding.get("histogram") or {}, finding.get("expected_histogram") or {}
    if not isinstance(got, Mapping) or not isinstance(want, Mapping):
        return []
    lengths = sorted({int(k) for k in [*got, *want] if str(k).lstrip("-").isdigit()})
    top = max([*got.values(), *want.values(), 1])
    return [{"length": n, "got": got.get(str(n), 0), "expected": want.get(str(n), 0),
             "got_px": round(BAR_HEIGHT * got.get(str(n), 0) / top), "expected_px": round(BAR_HEIGHT * want.get(str(n), 0) / top)}
            for n in lengths]


def generic_rows(findings: Sequence[Mapping]) -> tuple[list[str], list[list[object]]]:
    """Any findings as one table: the union of their keys as columns (lists shortened)."""
    columns = list(dict.fromkeys(k for f in findings for k in f))
    return columns, [[_short(f.get(c, "")) for c in columns] for f in findings]


def _short(value: object) -> object:
    if isinstance(value, (list, dict)) and len(value) > 12:
        return f"{str(list(value)[:12])[:-1]}, … ({len(value)} items)]"
    return value


def _tokens(detail: Sequence[Mapping]) -> dict:
    return {"kind": "tokens", "items": [(d, token_diff(d)) for d in detail]}


def _bits(detail: Sequence[Mapping]) -> dict:
    return {"kind": "bits", "items": [(d, bitwise(d.get("expected"), d.get("got"))) for d in detail]}


def _tiers(detail: Sequence[Mapping]) -> dict | None:
    if not any(tier_table(d) for d in detail):
        return None
    return {"kind": "tiers", "items": [(d, tier_table(d)) for d in detail]}


def _accept(detail: Sequence[Mapping]) -> dict:
    return {"kind": "accept", "items": [(d, accept_bars(d)) for d in detail], "bar_height": BAR_HEIGHT}


#: the views an oracle may declare for its findings (``harness.oracles.view.Oracle.evidence``), by kind: each builds
#: the view model of some findings, or None where they do not fit it (they show as a table then).
KINDS: dict[str, Callable[[Sequence[Mapping]], dict | None]] = {
    "tokens": _tokens, "bits": _bits, "tiers": _tiers, "accept": _accept}


def views(kind: str | None, detail: Sequence[Mapping]) -> dict:
    """The view model of one oracle's findings: the kind of view its declaration names (``KINDS``) where they fit it,
    else the generic table."""
    detail = [d for d in detail if isinstance(d, Mapping)]
    view = KINDS[kind](detail) if detail and kind in KINDS else None
    if view is not None:
        return view
    columns, rows = generic_rows(detail)
    return {"kind": "table", "columns": columns, "rows": rows}
