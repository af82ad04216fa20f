"""Top-Down columns of a report: level 1 in percent of peak, and the verdict (bound_by, culprit, advice text).

The verdict ``bound_by`` is the level-2 node (level-1 ``retire`` excluded) that loses the most issue slots; its
``culprit`` is the stall reason (level-3 node) under it that loses the most; the advice is that node's description.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["grouped_topdown", "topdown_per_launch"]


def topdown_per_launch(ds):
    """Top-Down nodes per range (percent of peak) and IPC_MAX, or None when the Dataset lacks the Top-Down
    metrics."""
    from gpuscope.errors import MissingMetricsError
    from gpuscope.metrics import topdown as td

    try:
        nodes = td.topdown(ds, check="ignore")
    except (MissingMetricsError, ValueError):
        return None
    ipc_max = float(nodes.attrs["topdown_ipc_max"])
    return nodes, ipc_max


def grouped_topdown(nodes, key) -> tuple[dict[str, dict[str, float]], np.ndarray]:
    """Per group of *key* (one label per range), every node's value (percent of peak) over the group's launches,
    weighted by kernel length in cycles (:func:`gpuscope.metrics.topdown.aggregate`); and which launches were left
    out for having no verdict. A launch whose Top-Down is not a number (NaN or inf inputs) is left out, not averaged
    in as 0; so is one without a verdict (``decided`` false, else ``consistent`` false in a Top-Down made before
    ``decided``: docs/topdown.md). A group none of whose kept launches decides its culprit has the key
    ``"_culprit_decided"`` False (:func:`_verdict` then names no culprit)."""
    from gpuscope.metrics import topdown as td

    valid = np.logical_and.reduce([np.isfinite(nodes[n].values) for n in td.level_cut(1)])
    undecided = np.zeros_like(valid)
    flag = "decided" if "decided" in nodes.coords else "consistent" if "consistent" in nodes.coords else None
    if flag is not None:
        undecided = valid & ~nodes[flag].values.astype(bool)
        valid &= ~undecided
    rows = {}
    if valid.any():
        kept = nodes.isel(range=np.flatnonzero(valid)).assign_coords(_group=("range", np.asarray(key)[valid]))
        weighted = td.aggregate(kept, by="_group")
        rows = {str(k): {v: float(weighted[v].sel(_group=k)) for v in weighted.data_vars}
                for k in weighted["_group"].values}
        if "culprit_decided" in kept.coords:
            groups = np.asarray(kept["_group"].values).astype(str)
            culprit = kept["culprit_decided"].values.astype(bool)
            for k, row in rows.items():
                row["_culprit_decided"] = bool(culprit[groups == k].any())
    return rows, undecided


def _verdict(row: dict | None) -> tuple[str, str, str]:
    """(bound_by, culprit, advice) from one row's Top-Down node values; "no data" where none is finite; culprit
    "undecided" where the row's key ``"_culprit_decided"`` is False (:func:`grouped_topdown`)."""
    from gpuscope.metrics import topdown as td

    level2 = [n for n in td.level_cut(2, row or {}) if n != "retire"]
    values = {n: row[n] for n in level2 if np.isfinite(row[n])}
    if not values:
        return "no data", "", ""
    bound = max(values, key=values.get)
    advice = next(n.description for n in td.NODES if n.name == bound)
    if row.get("_culprit_decided") is False:
        return bound, "undecided", advice
    children = {n.name: row[n.name] for n in td.NODES if n.parent == bound and n.name in row and np.isfinite(row[n.name])}
    culprit = max(children, key=children.get)[len(bound) + 1:] if children else ""
    return bound, culprit, advice


def _topdown_columns(frame: pd.DataFrame, rows: dict) -> list[str]:
    """Top-Down level 1, bound_by, culprit and advice per row of *frame*, from *rows*: row label -> node values
    (percent of peak; a row without any is "no data", never a number). Returns the level-1 columns."""
    from gpuscope.metrics import topdown as td

    level1 = td.level_cut(1)
    for node in level1:
        frame[node] = [rows.get(k, {}).get(node, np.nan) for k in frame.index]
    verdicts = [_verdict(rows.get(k)) for k in frame.index]
    frame["bound_by"] = [v[0] for v in verdicts]
    frame["culprit"] = [v[1] for v in verdicts]
    frame["advice"] = [v[2] for v in verdicts]
    return level1
