"""A run's rows as a pandas DataFrame: one row per cell, for the grid, compare, locate's tallies and a notebook.

Columns: ``cell_id``, ``status``, ``failing`` (status fail or error), ``matrix``, ``run_id``, ``device``,
``faults`` (a tuple), ``error`` (the traceback's last line); ``failing`` means the cell fails the run (fail, error,
xpass), then ``factor.NAME`` for each factor (the
level as the row holds it: a string, int or float), ``oracle.NAME`` for each oracle's verdict and
``metric.NAME`` for each numeric metric (nullable floats: ``<NA>`` where a cell lacks the metric, NaN
where it recorded NaN, so a metric that went NaN is still told apart from one never measured).
The cell id is also the index, so two runs align with ``join``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from harness.results.reader import load
from harness.results.rows import FAILING, as_float, error_line

FACTOR, ORACLE, METRIC = "factor.", "oracle.", "metric."


def frame(rows: Sequence[Mapping]) -> pd.DataFrame:
    """The rows (results.jsonl objects) as a DataFrame indexed by cell id, in row order."""
    records, metrics = [], {}
    for i, row in enumerate(rows):
        record = {"cell_id": row["cell_id"], "status": row["status"], "failing": row["status"] in FAILING,
                  "matrix": row.get("matrix"), "run_id": row.get("run_id"), "device": row.get("device"),
                  "faults": tuple(row.get("faults", ())), "error": error_line(row.get("error"))}
        record.update({FACTOR + name: level for name, level in row["factors"].items()})
        record.update({ORACLE + name: verdict["verdict"] for name, verdict in row["oracles"].items()})
        for name, value in (row.get("metrics") or {}).items():
            number = as_float(value)
            if number is not None:
                metrics.setdefault(METRIC + name, {})[i] = number
        records.append(record)
    table = pd.DataFrame.from_records(records, columns=_columns(records))
    for name, values in metrics.items():
        data, missing = np.zeros(len(records)), np.ones(len(records), dtype=bool)
        for i, number in values.items():
            data[i], missing[i] = number, False
        table[name] = pd.arrays.FloatingArray(data, missing)
    return table.set_index("cell_id", drop=False).rename_axis(None)


def _columns(records: Sequence[Mapping]) -> list[str]:
    """The fixed columns, then factors and oracles in the order the rows first name them."""
    fixed = ["cell_id", "status", "failing", "matrix", "run_id", "device", "faults", "error"]
    seen = dict.fromkeys(key for record in records for key in record if key not in fixed)
    return fixed + [key for prefix in (FACTOR, ORACLE) for key in seen if key.startswith(prefix)]


def read_frame(*paths: str | Path) -> pd.DataFrame:
    """The DataFrame of one or more report directories (or results.jsonl files), merged by cell id."""
    return frame(load([Path(p) for p in paths]).rows)


def factor_columns(table: pd.DataFrame) -> list[str]:
    """The ``factor.NAME`` columns of ``table``, in order."""
    return [c for c in table.columns if c.startswith(FACTOR)]


def failed_oracles(table: pd.DataFrame) -> pd.Series:
    """Per cell, what failed: the failing oracles' names joined by ", ", else "error" for an errored cell."""
    oracles = [c for c in table.columns if c.startswith(ORACLE)]
    names = table[oracles].eq("fail").apply(lambda failed: ", ".join(c[len(ORACLE):] for c in failed.index[failed]),
                                            axis=1) if oracles else pd.Series("", index=table.index)
    return names.where(names != "", table["status"].eq("error").map({True: "error", False: ""}))
