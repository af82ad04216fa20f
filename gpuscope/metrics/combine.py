"""Range results per group for the speed-of-light analyses: counts added, rates weighted by duration, metrics found.

The roofline, memory and instruction analyses work on one row per range (a kernel launch or a user range) or,
with ``by=``, on one row per group (``by="kernel"``). :func:`combine` makes the group rows: counters (bytes,
instructions, cycles, nanoseconds, whatever the rollup) are added, since the analyses divide totals by totals;
rates and ratios (``.per_second``, ``.per_cycle_*``, ``.pct*``, ``.ratio``) are weighted by each row's
``gpu__time_duration.sum``; a counter's ``.peak_sustained`` (the most it can count per cycle, a constant of the
chip) is kept. :func:`metric` finds a metric by its GH100 name, or what the chip collected instead (the set's
alternatives, :mod:`gpuscope.metrics.catalog`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope._schema.units import split_name
from gpuscope._util import validate as _validate
from gpuscope.errors import MissingMetricsError
from gpuscope.metrics import catalog as _catalog

__all__ = ["DURATION", "along", "combine", "metric", "require", "kind_of", "plain"]

#: The duration of a range: the time base of every rate and the weight of rates when rows are combined.
DURATION = "gpu__time_duration.sum"

_RATES = (".per_second", ".per_cycle", ".pct", ".ratio", ".max_rate")


def kind_of(name: str) -> str:
    """``"peak"`` (``.peak_sustained``: per cycle, a chip constant), ``"rate"`` (per second, per cycle, percent,
    ratio) or ``"count"`` (everything else: added when rows are combined)."""
    suffix = split_name(name)[1]
    if suffix.endswith(".peak_sustained"):
        return "peak"
    return "rate" if any(r in suffix for r in _RATES) else "count"


def plain(da: xr.DataArray) -> xr.DataArray:
    """*da* without its attrs (a metric's units and description do not describe what is computed from it)."""
    out = da.copy(deep=False)
    out.attrs = {}
    return out


def along(value, like: xr.DataArray) -> xr.DataArray:
    """*value* (a DataArray, or a number or None where the chip left a counter out: NaN) along the rows of *like*."""
    return plain(value) if isinstance(value, xr.DataArray) else xr.full_like(like, value, dtype=float)


def metric(ds: xr.Dataset, name: str, metric_set: str | None = None) -> xr.DataArray | None:
    """The values of metric *name*, or the sum of the first group of its alternatives in *metric_set* that *ds*
    holds in full (what a chip without *name* collects instead); None when neither is there."""
    if name in ds.data_vars:
        return ds[name]
    if metric_set is not None:
        for group in _catalog.get_set(metric_set).alternatives.get(name, ()):
            if group and all(m in ds.data_vars for m in group):
                return sum((ds[m] for m in group[1:]), ds[group[0]]).rename(name)
    return None


def require(ds: xr.Dataset, names, metric_set: str, what: str) -> dict[str, xr.DataArray]:
    """Each of *names* found with :func:`metric`, by name.

    Raises
    ------
    MissingMetricsError
        One of them (and its alternatives) is not in *ds*; the message names them and the set that has them.
    """
    found = {n: metric(ds, n, metric_set) for n in names}
    missing = tuple(n for n, v in found.items() if v is None)
    if missing:
        raise MissingMetricsError(
            f"{what} needs {', '.join(missing)}, which the Dataset does not hold. Collect the {metric_set!r} set "
            f"(gs.Profiler(metrics={metric_set!r}), or several: metrics=[{metric_set!r}, 'topdown']).", missing)
    return found


def combine(ds: xr.Dataset, by: str | None, dim: str = "range") -> xr.Dataset:
    """One row per group of *ds*'s rows along *dim*: counters added, rates weighted by duration, peaks kept.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results.
    by : str or None
        A coordinate along *dim* to group by (``"kernel"``, ``"name"``); None returns *ds* as it is.
    dim : str
        The dimension of the rows.

    Returns
    -------
    xarray.Dataset
        The metric variables along *dim* combined, with dim *by* and a coordinate ``count`` (rows per group);
        variable and Dataset attrs kept.

    Raises
    ------
    TypeError
        *ds* is not a Dataset.
    ValueError
        *dim* or *by* is not in *ds*.
    MissingMetricsError
        *ds* has rates to combine but no ``gpu__time_duration.sum`` to weight them by.
    """
    ds = _validate.dataset(ds, "ds")
    if by is None:
        return ds
    if dim not in ds.dims:
        raise ValueError(f"the Dataset has no dimension {dim!r} (dims: {list(ds.dims)})")
    if by not in ds.coords or ds[by].dims != (dim,):
        raise ValueError(f"no coordinate {by!r} along {dim!r} to group by; coordinates: {list(ds.coords)}")
    names = [str(n) for n, v in ds.data_vars.items() if dim in v.dims and np.issubdtype(v.dtype, np.number)]
    kinds = {n: kind_of(n) for n in names}
    data = ds[names].drop_vars([c for c in ds.coords if c != by])
    groups = data.groupby(by)
    out = {}
    counts = [n for n in names if kinds[n] == "count"]
    if counts:
        summed = groups.sum(dim, min_count=1)
        out.update({n: summed[n] for n in counts})
    peaks = [n for n in names if kinds[n] == "peak"]
    if peaks:
        kept = data[peaks].groupby(by).max(dim)
        out.update({n: kept[n] for n in peaks})
    rates = [n for n in names if kinds[n] == "rate"]
    if rates:
        if DURATION not in ds.data_vars:
            raise MissingMetricsError(f"combining rates ({', '.join(rates[:3])}, ...) per {by!r} weights them by "
                                      f"{DURATION}, which the Dataset does not hold: collect it with the metrics.",
                                      (DURATION,))
        w = data[DURATION].where(np.isfinite(data[DURATION]), 0.0)
        weighted = (data[rates] * w).groupby(by).sum(dim, min_count=1)
        wsum = w.groupby(data[by]).sum(dim)
        out.update({n: weighted[n] / wsum.where(wsum > 0) for n in rates})
    count = data[by].groupby(data[by]).count()
    result = xr.Dataset({n: out[n] for n in names}).assign_coords(count=count)
    for n in names:
        result[n].attrs = ds[n].attrs
    result.attrs = dict(ds.attrs)
    return result
