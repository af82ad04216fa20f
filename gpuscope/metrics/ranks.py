"""Cross-rank analysis of merged range results (a ``rank`` dim, from :func:`gpuscope.open_ranks`): time per range
and rank, load imbalance and the slowest rank, Top-Down per rank, and a plot. Pure xarray; matplotlib lazily."""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope._util import validate as _validate
from gpuscope.errors import MissingMetricsError

__all__ = ["rank_times", "imbalance", "rank_topdown", "plot_ranks"]

#: Metrics that give a range's GPU time in ns, best first; else ``end_ns - start_ns``.
TIME_METRICS = ("gpu__time_duration.sum",)


def _merged(ds, what: str) -> xr.Dataset:
    ds = _validate.dataset(ds, "ds")
    if "rank" not in ds.dims or "range" not in ds.dims:
        raise ValueError(f"{what} needs range results merged across ranks (dims 'rank' and 'range', from "
                         f"gpuscope.open_ranks); this Dataset has dims {list(ds.dims)}")
    return ds


def _by(ds, by):
    if by is None:
        return None
    if by == "auto":
        return "kernel" if "kernel" in ds.coords and (ds["kernel"].values.astype(str) != "").any() else "name"
    if by not in ds.coords or ds[by].dims != ("range",):
        keys = [c for c in ds.coords if ds[c].dims == ("range",)]
        raise ValueError(f"by must be None, 'auto' or a coordinate along 'range' ({keys}); got {by!r}")
    return by


def range_time(ds) -> xr.DataArray:
    """Each range's time on each rank in ns: ``gpu__time_duration.sum`` where collected, else ``end_ns - start_ns``
    (NaN where the rank did not run the range)."""
    for name in TIME_METRICS:
        if name in ds.data_vars:
            return ds[name].astype(float)
    if "start_ns" in ds.coords and "end_ns" in ds.coords:
        start, end = ds["start_ns"].astype(float), ds["end_ns"].astype(float)
        return (end - start).where((start >= 0) & (end >= start))
    raise MissingMetricsError("no range time: collect gpu__time_duration.sum with the metrics, or profile with a "
                              "mode that records start_ns/end_ns", TIME_METRICS)


def rank_times(ds, by: str | None = "auto") -> xr.DataArray:
    """Time per rank and group of ranges, in ns.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results with a ``rank`` dim (:func:`gpuscope.open_ranks`).
    by : str or None
        Coordinate along ``range`` to sum by: ``"auto"`` (``kernel`` for launches, else ``name``), any range
        coordinate, or None for the whole run.

    Returns
    -------
    xarray.DataArray
        Dims (``rank``, *by*) (or ``rank`` alone), units ns. A group a rank never ran sums to 0; see
        :func:`imbalance` for which ranks ran it.

    Raises
    ------
    ValueError
        *ds* has no ``rank`` or ``range`` dim, or *by* is not a range coordinate.
    gpuscope.errors.MissingMetricsError
        Neither ``gpu__time_duration.sum`` nor ``start_ns``/``end_ns``.
    """
    ds = _merged(ds, "rank_times")
    by = _by(ds, by)
    t = range_time(ds)
    t = t.drop_vars([c for c in t.coords if c not in ("rank", by)])
    out = t.sum("range") if by is None else t.groupby(ds[by]).sum("range")
    out.attrs = {"units": "ns", "description": "time of the ranges per rank" + (f", by {by}" if by else "")}
    return out.rename("time")


def imbalance(ds, by: str | None = "auto") -> xr.Dataset:
    """Load imbalance per group of ranges: how much longer the slowest rank took than the average rank.

    ``imbalance = max / mean - 1`` over the ranks that ran the group (0: perfectly balanced; 0.25: the slowest
    rank took 25% longer than the mean, so the others wait for it that long at the next synchronisation).

    Parameters
    ----------
    ds : xarray.Dataset
        Range results with a ``rank`` dim (:func:`gpuscope.open_ranks`).
    by : str or None
        As in :func:`rank_times`.

    Returns
    -------
    xarray.Dataset
        Along *by* (or no dim): ``time`` (rank, *by*) in ns, ``mean``, ``max`` (ns), ``imbalance``,
        ``slowest_rank`` (the rank label, -1 where no rank ran the group), ``ranks`` (how many ranks ran it).

    Raises
    ------
    ValueError, gpuscope.errors.MissingMetricsError
        As :func:`rank_times`.

    Examples
    --------
    >>> merged = gs.open_ranks("prof-*.nc")                                # doctest: +SKIP
    >>> gs.imbalance(merged).to_dataframe()[["imbalance", "slowest_rank"]]  # doctest: +SKIP
    """
    ds = _merged(ds, "imbalance")
    by = _by(ds, by)
    t = range_time(ds)
    t = t.drop_vars([c for c in t.coords if c not in ("rank", by)])
    ran = t.notnull()
    if by is None:
        time, ranks_ran = t.sum("range"), ran.any("range")
    else:
        time, ranks_ran = t.groupby(ds[by]).sum("range"), ran.groupby(ds[by]).any("range")
    time = time.where(ranks_ran)
    mean, top = time.mean("rank"), time.max("rank")
    some = ranks_ran.any("rank")
    slowest = xr.where(some, time.fillna(-np.inf).argmax("rank"), -1)
    labels = np.append(ds["rank"].values, -1)  # position -1 picks the -1
    slowest_rank = xr.DataArray(labels[slowest.values], dims=slowest.dims, coords=slowest.coords)
    out = xr.Dataset({
        "time": time.assign_attrs(units="ns", description="time of the group per rank, NaN where it did not run"),
        "mean": mean.assign_attrs(units="ns", description="mean over the ranks that ran the group"),
        "max": top.assign_attrs(units="ns", description="the slowest rank's time"),
        "imbalance": (top / mean - 1).assign_attrs(units="1", description="max / mean - 1"),
        "slowest_rank": slowest_rank.assign_attrs(description="rank with the largest time, -1 where none ran it"),
        "ranks": ranks_ran.sum("rank").assign_attrs(description="ranks that ran the group"),
    })
    out.attrs = {"imbalance_by": by or "", "merged_ranks": int(ds.sizes["rank"])}
    return out


def rank_topdown(ds, by: str | None = "auto", levels=(1,)) -> xr.Dataset:
    """Top-Down per rank (and group): :func:`gpuscope.topdown` of every range, then :func:`gpuscope.aggregate`
    weighted by kernel length, rank by rank. Ranges a rank did not run (NaN) weigh nothing.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results with a ``rank`` dim holding the Top-Down metrics.
    by : str or None
        As in :func:`rank_times`.
    levels : int or sequence of int
        Top-Down levels.

    Returns
    -------
    xarray.Dataset
        One variable per node, dims (*by*, ``rank``) (or ``rank``).

    Raises
    ------
    gpuscope.errors.MissingMetricsError
        The Top-Down metrics are not there.
    ValueError
        As :func:`rank_times`.
    """
    from gpuscope.metrics.topdown import aggregate, topdown

    ds = _merged(ds, "rank_topdown")
    by = _by(ds, by)
    td = topdown(ds, levels=levels, check="ignore")
    out = aggregate(td, by=by)
    return out.drop_vars([c for c in ("count",) if c in out.coords])


def plot_ranks(ds, by: str | None = "auto", *, topdown: bool | None = None):
    """Time per group and rank as grouped bars, the slowest rank of each group outlined and its imbalance written
    above; beside it, Top-Down level 1 per rank (stacked bars) where the metrics allow.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results with a ``rank`` dim.
    by : str or None
        As in :func:`rank_times`.
    topdown : bool, optional
        Draw the Top-Down panel (default: when the Dataset has the metrics).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError, gpuscope.errors.MissingMetricsError
        As :func:`imbalance`; and ``topdown=True`` without the Top-Down metrics.
    """
    import matplotlib.pyplot as plt

    imb = imbalance(ds, by)
    td = None
    if topdown is not False:
        try:
            td = rank_topdown(ds, by=None, levels=(1,))
        except MissingMetricsError:
            if topdown:
                raise
    fig, axes = plt.subplots(1, 2 if td is not None else 1, figsize=(11 if td is not None else 7, 4), squeeze=False)
    _bars(axes[0, 0], imb)
    if td is not None:
        _topdown_bars(axes[0, 1], td)
    fig.tight_layout()
    return fig


def _bars(ax, imb) -> None:
    from matplotlib.patches import Patch

    time = imb["time"]
    group_dim = [d for d in time.dims if d != "rank"]
    groups = [str(g) for g in time[group_dim[0]].values] if group_dim else ["all"]
    values = time.transpose("rank", *group_dim).values.reshape(time.sizes["rank"], len(groups)) / 1e6
    ranks = time["rank"].values.tolist()
    width = 0.8 / len(ranks)
    slowest = np.atleast_1d(imb["slowest_rank"].values)
    ratio = np.atleast_1d(imb["imbalance"].values)
    x = np.arange(len(groups))
    handles = []
    for i, r in enumerate(ranks):
        bars = ax.bar(x - 0.4 + width * (i + 0.5), np.nan_to_num(values[i]), width)
        handles.append(Patch(facecolor=bars.patches[0].get_facecolor(), label=f"rank {r}"))
        for g, bar in enumerate(bars):
            if slowest[g] == r:
                bar.set_edgecolor("black")
                bar.set_linewidth(2)
    for g in range(len(groups)):
        if np.isfinite(ratio[g]):
            ax.annotate(f"+{100 * ratio[g]:.1f}%", (x[g], np.nanmax(values[:, g])), ha="center", va="bottom",
                        fontsize=8)
    ax.set_xticks(x, groups)
    ax.set_ylabel("time per rank (ms)")
    ax.set_title("time per rank (outlined: slowest; label: max/mean - 1)")
    ax.legend(handles=handles, fontsize=8)


def _topdown_bars(ax, td) -> None:
    nodes = [n for n in ("retire", "divergence", "frontend", "backend") if n in td]
    ranks = td["rank"].values.tolist()
    bottom = np.zeros(len(ranks))
    for node in nodes:
        v = np.nan_to_num(td[node].values.reshape(len(ranks)))
        ax.bar(np.arange(len(ranks)), v, 0.6, bottom=bottom, label=node)
        bottom += v
    ax.set_xticks(np.arange(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylabel("% of peak issue rate" if nodes else "")
    ax.set_title("Top-Down level 1 per rank")
    ax.legend(fontsize=8)
