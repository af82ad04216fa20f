"""The report of PC samples: one row per kernel, with its share, how often it issued, its top stall reasons."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results.report_inputs import _device_line
from gpuscope._results.report_table import Report, _count, _new, _percent_columns


def _pc_report(ds, *, top: int = 3) -> Report:
    counts = ds["kernel_samples"]
    reasons = np.asarray(counts["stall_reason"].values).astype(str)
    kernels = np.asarray(counts["kernel"].values).astype(str)
    values = np.asarray(counts.values, dtype=float)
    total = values.sum(axis=1)
    issued = np.isin(reasons, ("selected",))
    out = pd.DataFrame(index=pd.Index(kernels, name="kernel"))
    out["samples"] = total.astype(np.int64)
    out["share"] = 100 * total / total.sum() if total.sum() else np.nan
    out["issued"] = 100 * values[:, issued].sum(axis=1) / np.where(total > 0, total, np.nan)
    stalls = np.where(issued | np.isin(reasons, ("not_selected",)), 0.0, values)
    for i in range(top):
        names, pct = [], []
        for k in range(len(kernels)):
            order = np.argsort(-stalls[k], kind="stable")
            j = order[i] if i < len(order) else None
            ok = j is not None and stalls[k, j] > 0 and total[k] > 0
            names.append(reasons[j] if ok else "")
            pct.append(100 * stalls[k, j] / total[k] if ok else np.nan)
        out[f"stall_{i + 1}"] = names
        out[f"stall_{i + 1}_share"] = pct
    out = out.sort_values("samples", ascending=False, kind="stable")
    title = (f"gpuscope report: PC sampling, {int(ds.attrs.get('total_samples', total.sum()))} samples, "
             f"{_count(len(out), 'kernel')} ({_device_line(ds)})")
    notes = ["issued: share of samples that found the warp issuing (selected); stall_N: the N-th most sampled "
             "stall reason and its share of the kernel's samples (gpuscope.fast_topdown for the hierarchy)."]
    dropped = int(ds.attrs.get("dropped_samples", 0) or 0)
    if dropped:
        notes.append(f"{dropped} samples were dropped by the hardware buffer.")
    percent = ["share", "issued", *[f"stall_{i + 1}_share" for i in range(top)]]
    return _new(out, title, notes, _percent_columns(*percent))
