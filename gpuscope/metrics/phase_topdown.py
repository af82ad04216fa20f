"""The dynamic analysis (``gs.dynamic``): a kernel's Top-Down launch by launch, or the Top-Down of each phase of a run.

The paper's dynamic analysis follows the Top-Down of a kernel from launch to launch. Over a whole run, PM sampling
says *when* the GPU changed behaviour (phases, :func:`gpuscope.metrics.phases.phases`) and range profiling says
*why* each kernel behaves as it does (:func:`gpuscope.metrics.topdown.topdown`); the two cannot hold the counters
at once, so they come from separate runs of the same work and are joined here on what both know:

* ``by="kernels"``: the GPU start and end of every kernel execution recorded during PM sampling
  (``gpuscope.sample(kernels=True)``, on the samples' CUPTI clock). A phase's Top-Down is the mean of its kernels'
  Top-Down weighted by the kernel time that falls inside the phase's segments.
* ``by="ranges"``: the user range each PM sample was taken in (its ``range`` coordinate). A phase's Top-Down is
  the mean over the user ranges it covers, weighted by the sampled time in each, of the Top-Down of the range
  results under that range path (rows whose ``name`` is the path or lies below it).

Node values still sum to 100% of ``IPC_MAX`` (weighted means of Top-Down Datasets are linear), so a phase's bars stack
like a kernel's. Time that no Top-Down can be given to (idle, kernels that were not range-profiled) is reported
in ``attributed_fraction``, never spread over the nodes.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope._schema import dataset as _dataset
from gpuscope._schema.labels import string_labels
from gpuscope._schema.names import match_kernel
from gpuscope._util import validate as _validate

__all__ = ["by_phase", "dynamic"]

BY = ("auto", "kernels", "ranges")


def by_phase(td: xr.Dataset, phases: xr.Dataset, by: str = "auto", dim: str = "range") -> xr.Dataset:
    """Top-Down per phase: see :func:`dynamic` with ``phases=``."""
    from gpuscope.metrics.topdown import NODES, aggregate

    td = _validate.dataset(td, "td")
    phases = _validate.dataset(phases, "phases")
    by = _validate.choice(by, "by", BY)
    if "segment_phase" not in phases or "phase_id" not in phases.dims:
        raise ValueError("phases= takes the result of gpuscope.phases(samples) (it has segment_phase and phase_id); "
                         "compute it first: ph = gpuscope.phases(ts)")
    if phases.attrs.get("phases_dim", "time") != "time" or "start_ns" not in phases.coords:
        raise ValueError("phases= must come from PM samples (dim 'time' with CUPTI timestamps start_ns/end_ns), "
                         "not from range results")
    nodes = [n.name for n in NODES if n.name in td.data_vars]
    if not nodes:
        raise ValueError("td holds no Top-Down nodes: pass gpuscope.topdown(range_results)")
    if dim not in td.dims:
        raise ValueError(f"td has no dimension {dim!r} (dims: {list(td.dims)})")
    if by == "auto":
        by = "kernels" if _dataset.has_executions(phases) else "ranges"
    if by == "kernels":
        if not _dataset.has_executions(phases):
            raise ValueError("by='kernels' needs the kernel executions of the PM run: record it with "
                             "gpuscope.sample(..., kernels=True), or use by='ranges'")
        groups, share = _kernel_time(phases)
        values, matched = _kernel_topdown(td, groups, nodes, aggregate, dim)
    else:
        groups, share = _range_time(phases)
        values, matched = _range_topdown(td, groups, nodes, aggregate, dim)
    return _assemble(td, phases, nodes, groups, share, values, matched, by)


# -- time per phase and group ---------------------------------------------------------------------------------


def _segments(ph: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segment bounds on the CUPTI clock (int64 ns, from the samples themselves) and each segment's phase."""
    start_ns = np.asarray(ph["start_ns"], dtype=np.int64)
    end_ns = np.asarray(ph["end_ns"], dtype=np.int64)
    first = np.asarray(ph["segment_first"], dtype=np.int64)
    stop = np.asarray(ph["segment_stop"], dtype=np.int64)
    lo = start_ns[first]
    if first.size:
        lo[0] = max(lo[0], int(ph.attrs.get("session_start_ns", lo[0])))  # the first sample reaches back before Start
    return lo, end_ns[stop - 1], np.asarray(ph["segment_phase"], dtype=np.int64)


def _phase_index(ph: xr.Dataset, labels: np.ndarray) -> np.ndarray:
    ids = np.asarray(ph["phase_id"], dtype=np.int64)
    return np.searchsorted(ids, labels)


def _kernel_time(ph: xr.Dataset) -> tuple[list[str], np.ndarray]:
    """Kernel names and the ns each one ran inside each phase: (phase_id, kernel)."""
    table = _dataset.kernel_executions(ph)
    names = table["kernel"].to_numpy(dtype=str)
    start = table["start_ns"].to_numpy(dtype=np.int64)
    end = table["end_ns"].to_numpy(dtype=np.int64)
    kernels, which = np.unique(names, return_inverse=True)
    lo, hi, labels = _segments(ph)
    row = _phase_index(ph, labels)
    share = np.zeros((ph.sizes["phase_id"], kernels.size))
    if not start.size or not lo.size:
        return kernels.tolist(), share
    # segments tile [lo[0], hi[-1]]; an execution overlaps the segments from first to last
    edges = np.append(lo, hi[-1])
    first = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, lo.size - 1)
    last = np.clip(np.searchsorted(edges, end, side="left") - 1, 0, lo.size - 1)
    for offset in range(int((last - first).max(initial=0)) + 1):
        seg = first + offset
        live = seg <= last
        s = seg[live]
        overlap = np.clip(np.minimum(end[live], hi[s]) - np.maximum(start[live], lo[s]), 0, None)
        np.add.at(share, (row[s], which[live]), overlap)
    return kernels.tolist(), share


def _range_time(ph: xr.Dataset) -> tuple[list[str], np.ndarray]:
    """Innermost user-range paths and the sampled ns in each inside each phase: (phase_id, range)."""
    if "range" not in ph.coords:
        raise ValueError("by='ranges' needs the samples' range coordinate (PM samples taken inside gpuscope.range)")
    paths = string_labels(ph["range"])
    start_ns = np.asarray(ph["start_ns"], dtype=np.int64)
    end_ns = np.asarray(ph["end_ns"], dtype=np.int64)
    duration = (end_ns - np.maximum(start_ns, int(ph.attrs.get("session_start_ns", start_ns[0])))).clip(0)
    lo_first = np.asarray(ph["segment_first"], dtype=np.int64)
    labels = np.repeat(np.asarray(ph["segment_phase"], dtype=np.int64),
                       np.asarray(ph["segment_stop"], dtype=np.int64) - lo_first)
    row = _phase_index(ph, labels)
    inside = paths != ""
    ranges, which = np.unique(paths[inside], return_inverse=True)
    share = np.zeros((ph.sizes["phase_id"], ranges.size))
    np.add.at(share, (row[inside], which), duration[inside])
    return ranges.tolist(), share


# -- Top-Down per group ---------------------------------------------------------------------------------------


def _kernel_topdown(td, kernels, nodes, aggregate, dim):
    """Each executed kernel's Top-Down (range results aggregated per kernel), matched by symbol, else by name,
    else by a unique name suffix (``module.stream`` and ``stream``)."""
    if "kernel" not in td.coords:
        raise ValueError("by='kernels' needs per-kernel range results (a 'kernel' coordinate): profile in kernel, "
                         "iteration or auto mode, or use by='ranges'")
    rows = td.isel({dim: np.flatnonzero(np.asarray(td["kernel"]).astype(str) != "")})
    per = aggregate(rows[nodes], by="kernel", weight=_weight(rows, dim), dim=dim) if rows.sizes[dim] else None
    names = [] if per is None else np.asarray(per["kernel"]).astype(str).tolist()
    symbols = {}
    if "symbol" in rows.coords:
        for s, k in zip(np.asarray(rows["symbol"]).astype(str), np.asarray(rows["kernel"]).astype(str), strict=True):
            if s:
                symbols.setdefault(s, k)
    values = np.full((len(kernels), len(nodes)), np.nan)
    matched = np.zeros(len(kernels), dtype=bool)
    for i, name in enumerate(kernels):
        hit = match_kernel(name, names, symbols)
        if hit is not None:
            values[i] = [float(per[n].sel(kernel=hit)) for n in nodes]
            matched[i] = True
    return values, matched


def _range_topdown(td, ranges, nodes, aggregate, dim):
    """Each user range's Top-Down: the range results whose path is the range or lies below it."""
    if "name" not in td.coords:
        raise ValueError("by='ranges' needs range results with a 'name' coordinate (paths)")
    paths = np.asarray(td["name"]).astype(str)
    weight = _weight(td, dim)
    depth = np.asarray(td["depth"]) if "depth" in td.coords else np.char.count(paths, "/") + 1
    values = np.full((len(ranges), len(nodes)), np.nan)
    matched = np.zeros(len(ranges), dtype=bool)
    for i, path in enumerate(ranges):
        under = (paths == path) | np.char.startswith(paths, path + "/")
        if not under.any():
            continue
        # the range's own row holds everything below it; without one (kernel rows only), its kernels' rows
        own = under & (paths == path)
        pick = own if own.any() else under & (depth == depth[under].min())
        sub = td[nodes].isel({dim: np.flatnonzero(pick)})
        one = aggregate(sub, by=None, weight=weight.isel({dim: np.flatnonzero(pick)}), dim=dim)
        values[i] = [float(one[n]) for n in nodes]
        matched[i] = True
    return values, matched


def _weight(td: xr.Dataset, dim: str) -> xr.DataArray:
    """Per-row weight for the means: aggregate's own default (kernel length in SM cycles when measured, else the
    range's duration), with unknown or negative weights as 0, and equal weights when there is none."""
    from gpuscope.errors import MissingMetricsError
    from gpuscope.metrics.topdown_aggregate import _weights

    try:
        return _weights(td, None, dim).fillna(0.0).clip(0)
    except MissingMetricsError:
        return xr.ones_like(td[dim], dtype=float)


# -- the result -----------------------------------------------------------------------------------------------


def _assemble(td, ph, nodes, groups, share, values, matched, by):
    n_phases = ph.sizes["phase_id"]
    known = share[:, matched]
    total_known = known.sum(axis=1)
    duration = np.asarray(ph["phase_duration"], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        weights = known / total_known[:, None]
        node_values = weights @ values[matched] if matched.any() else np.full((n_phases, len(nodes)), np.nan)
        node_values[total_known == 0] = np.nan
        attributed = np.where(duration > 0, total_known / duration, np.nan)
        unattributed = np.where(duration > 0, share[:, ~matched].sum(axis=1) / duration, np.nan)
    group_dim = "kernel" if by == "kernels" else "user_range"
    data = {
        n: xr.DataArray(node_values[:, j], dims="phase_id", attrs=dict(td[n].attrs)) for j, n in enumerate(nodes)
    }
    whole = np.issubdtype(ph["phase_duration"].dtype, np.integer)  # int64 ns in, int64 ns out
    data["time_in_phase"] = xr.DataArray(
        np.rint(share).astype(np.int64) if whole else share, dims=("phase_id", group_dim),
        attrs={"units": "ns", "description": f"time each {group_dim.replace('_', ' ')} ran inside the phase"})
    data["attributed_fraction"] = xr.DataArray(attributed, dims="phase_id", attrs={
        "units": "1", "description": "time of the phase's work that has a Top-Down, over the phase's duration "
                                     "(above 1 when kernels ran concurrently)"})
    data["unattributed_fraction"] = xr.DataArray(unattributed, dims="phase_id", attrs={
        "units": "1", "description": "time of the phase's work without a Top-Down (not range-profiled)"})
    coords = {
        "phase_id": ph["phase_id"].values,
        group_dim: np.asarray(groups, dtype=str),
        "has_topdown": (group_dim, matched),
        "phase_duration": ("phase_id", ph["phase_duration"].values, dict(ph["phase_duration"].attrs)),
        "phase_fraction": ("phase_id", np.asarray(ph["phase_fraction"], dtype=float), {"units": "1"}),
    }
    attrs = {k: v for k, v in td.attrs.items()}
    attrs.update(kind="topdown_by_phase", topdown_by=by, phases_segments=int(ph.sizes.get("segment", 0)),
                 phases_session_start_ns=int(ph.attrs.get("session_start_ns", -1)))
    return xr.Dataset(data, coords=coords, attrs=attrs)


def dynamic(td: xr.Dataset, kernel: str | None = None, dim: str = "range", *, phases: xr.Dataset | None = None,
            by: str = "auto") -> xr.Dataset:
    """The paper's dynamic analysis: one kernel's Top-Down launch by launch, or (``phases=``) the Top-Down of
    each phase of a PM-sampled run.

    Without *phases*: one kernel's ranges in launch order. The result keeps ``dim`` and its coordinates
    (``launch`` among them), so :func:`gpuscope.metrics.phases.phases` and the timeline plot apply directly.

    With *phases* (``gpuscope.phases(samples)``): each phase gets the Top-Down of the work that ran in it, joined
    through what both runs know (range profiling and PM sampling cannot hold the counters at once, so they come
    from two runs of the same work; see :mod:`gpuscope.metrics.phase_topdown`):

    * ``by="kernels"``: the kernel executions recorded during sampling (``gpuscope.sample(kernels=True)``), each
      phase weighting its kernels' Top-Down (range results aggregated per kernel) by their GPU time inside it;
    * ``by="ranges"``: the user range of each sample, each phase weighting the Top-Down of the range results under
      that range path by the sampled time in it;
    * ``by="auto"``: kernels when the samples have them, else ranges.

    Parameters
    ----------
    td : xarray.Dataset
        Range Dataset, usually Top-Down output (:func:`topdown`); with *phases*, it must be Top-Down output.
    kernel : str, optional
        Kernel name; may be omitted when there is only one (without *phases*).
    dim : str
        The range dimension.
    phases : xarray.Dataset, optional
        The phases of a PM-sampled run of the same work.
    by : {"auto", "kernels", "ranges"}
        How phases and range results are joined (with *phases*).

    Returns
    -------
    xarray.Dataset
        Without *phases*: the kernel's rows of *td*. With *phases*: dim ``phase_id``; every Top-Down node of *td*
        (same names, units and attrs; NaN for a phase without profiled work, e.g. idle); ``time_in_phase``
        (phase_id, ``kernel`` or ``user_range``: ns of each inside the phase), ``attributed_fraction`` (time with
        a Top-Down over the phase's duration) and ``unattributed_fraction`` (work without one); coords
        ``phase_duration``, ``phase_fraction``, ``has_topdown``; attrs of *td* plus ``kind="topdown_by_phase"``,
        ``topdown_by``.

    Raises
    ------
    ValueError
        Missing ``kernel``/``launch`` coordinates, an unknown kernel, or several kernels and none chosen; with
        *phases*: not a phases Dataset of PM samples, *td* without Top-Down nodes, ``by="kernels"`` on samples
        recorded without ``kernels=True``.

    Examples
    --------
    >>> td = gs.topdown(launches)                              # doctest: +SKIP
    >>> per_phase = gs.dynamic(td, phases=gs.phases(samples))  # doctest: +SKIP
    >>> per_phase[["retire", "frontend", "backend"]].to_pandas()   # doctest: +SKIP
    """
    if phases is not None:
        if kernel is not None:
            raise ValueError("kernel= and phases= do not go together: a phase's Top-Down covers all its kernels")
        return by_phase(td, phases, by=by, dim=dim)
    for coord in ("kernel", "launch"):
        if coord not in td.coords:
            raise ValueError(f"dynamic analysis needs a {coord!r} coordinate along {dim!r} (auto-range results)")
    kernels = list(dict.fromkeys(np.asarray(td["kernel"]).tolist()))
    if kernel is None:
        if len(kernels) != 1:
            raise ValueError(f"several kernels in the Dataset, choose one with kernel=: {kernels}")
        kernel = kernels[0]
    if kernel not in kernels:
        raise ValueError(f"no kernel {kernel!r} in the Dataset; kernels: {kernels}")
    return td.isel({dim: np.flatnonzero(np.asarray(td["kernel"]) == kernel)}).sortby("launch")
