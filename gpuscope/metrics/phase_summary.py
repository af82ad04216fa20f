"""Per-segment and per-phase summaries of phases: sample extents, duration-weighted means, Top-Down per phase.

The numbers :func:`gpuscope.metrics.phases.phases` adds to its result once the segments and their labels are
known: ``segment_*`` and ``phase_*`` durations and means, and ``phase_topdown``.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.errors import MissingMetricsError


def _extent(ds: xr.Dataset, dim: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Start and end of every sample and their unit: start_ns/end_ns (int64 ns), else the coordinate (last sample
    as long as the one before; its ``units``, ``"ns"`` for a time coordinate of integers), else the index
    (``"samples"``)."""
    n = ds.sizes[dim]
    if "start_ns" in ds.coords and "end_ns" in ds.coords and ds["start_ns"].dims == (dim,):
        return np.asarray(ds["start_ns"], dtype=np.int64), np.asarray(ds["end_ns"], dtype=np.int64), "ns"
    if dim in ds.coords and np.issubdtype(ds[dim].dtype, np.number):
        pos, units = np.asarray(ds[dim]), str(ds[dim].attrs.get("units", "") or ("ns" if dim == "time" else ""))
        units = units or f"{dim} coordinate"
    else:
        pos, units = np.arange(n, dtype=np.int64), "samples"
    pos = pos.astype(np.int64 if np.issubdtype(pos.dtype, np.integer) else float)
    step = np.diff(pos)
    end = np.append(pos[1:], pos[-1] + (step[-1] if len(step) else 1)).astype(pos.dtype)
    return pos, end, units


def _clip_reach_back(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Start of the first sample moved to one median duration before its end, when it lasts over twice that
    (in whole units where the times are integers)."""
    if len(start) < 3:
        return start
    typical = np.median(end[1:] - start[1:])
    if np.issubdtype(start.dtype, np.integer):
        typical = int(round(float(typical)))
    if end[0] - start[0] <= 2.0 * typical:
        return start
    start = start.copy()
    start[0] = end[0] - typical
    return start


def _phase_topdown(ds: xr.Dataset, first, weight, labels, n_phases, mode):
    """Duration-weighted per-phase means of the Top-Down nodes, or None when the metrics do not allow it."""
    from gpuscope.metrics.topdown import topdown  # late: topdown is only needed when the metrics allow it

    try:
        td = topdown(ds, check="ignore")
    except (MissingMetricsError, ValueError):
        if mode is True:
            raise
        return None
    nodes = list(td.data_vars)
    values = np.stack([np.asarray(td[n], dtype=float) for n in nodes])
    da = xr.DataArray(_means(*_segment_sums(values, weight, first), labels, n_phases), dims=("phase_id", "node"),
                      coords={"node": nodes})
    da.attrs = {"units": td[nodes[0]].attrs["units"], "ipc_max": td.attrs["topdown_ipc_max"]}
    return da


def _segment_sums(values: np.ndarray, weight: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sums and summed weights per segment of ``values`` (metrics x samples), ignoring NaNs."""
    ok = np.isfinite(values)
    if ok.all():
        num = np.add.reduceat(values * weight, first, axis=1)
        den = np.broadcast_to(np.add.reduceat(weight, first), num.shape)
    else:
        w = ok * weight
        num = np.add.reduceat(np.where(ok, values, 0.0) * w, first, axis=1)
        den = np.add.reduceat(w, first, axis=1)
    return num.T, np.array(den.T)


def _means(num: np.ndarray, den: np.ndarray, group: np.ndarray | None = None, k: int = 0) -> np.ndarray:
    """Per-segment means, or per-group means of segment sums when ``group`` labels the segments."""
    if group is not None:
        num, den = (np.stack([np.bincount(group, weights=a[:, j], minlength=k) for j in range(a.shape[1])], 1)
                    for a in (num, den))
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den
