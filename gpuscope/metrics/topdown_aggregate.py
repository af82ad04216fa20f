"""Length-weighted means of a Top-Down over ranges: per kernel, per group, or over the whole run.

Aggregate the Top-Down Dataset, not the raw metrics (:func:`aggregate` says why).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope._util import validate as _validate
from gpuscope.errors import MissingMetricsError

__all__ = ["WEIGHT_METRICS", "aggregate"]

#: Metrics that weight ranges in :func:`aggregate`, first found wins; kernel length in cycles, as the paper does.
WEIGHT_METRICS = ("sm__cycles_elapsed.max", "sm__cycles_elapsed.avg", "sm__cycles_elapsed.sum")


def _weights(ds: xr.Dataset, weight, dim: str) -> xr.Variable:
    if isinstance(weight, xr.DataArray):
        return weight
    names = WEIGHT_METRICS if weight is None else (weight,)
    for name in names:
        if name in ds.variables:
            return ds[name].astype(float)
    if weight is None and "weight" in ds.coords and dim in ds["weight"].dims:  # gpuscope.topdown's copy
        return ds["weight"].astype(float)
    if weight is None and "start_ns" in ds.coords and "end_ns" in ds.coords:
        return (ds["end_ns"] - ds["start_ns"]).astype(float)
    raise MissingMetricsError(
        f"no weight for aggregating over {dim!r}: the Dataset has none of {', '.join(names)}"
        + (" and no start_ns/end_ns coordinates" if weight is None else "")
        + ". Collect sm__cycles_elapsed.max with the metrics, or pass weight=<DataArray>.",
        tuple(names),
    )


def _check_weight(ds: xr.Dataset, weight, dim: str) -> None:
    """Refuse a weight that would average silently wrong: an array without dims, a name that is not there."""
    along = [str(n) for n in (*ds.data_vars, *ds.coords) if dim in ds[n].dims and np.issubdtype(ds[n].dtype, np.number)]
    allowed = f"None, the name of a variable or coordinate along {dim!r} (e.g. {along[:3]}), or a DataArray along {dim!r}"
    if weight is None:
        return
    if isinstance(weight, xr.DataArray):
        if dim not in weight.dims or weight.sizes[dim] != ds.sizes.get(dim):
            raise ValueError(f"weight must be {allowed} with {ds.sizes.get(dim)} values; got a DataArray with sizes "
                             f"{dict(weight.sizes)}.")
        return
    if not isinstance(weight, str):
        hint = f" (wrap an array: xr.DataArray(values, dims={dim!r}))" if isinstance(weight, (np.ndarray, list)) else ""
        raise TypeError(f"weight must be {allowed}{hint}; got {type(weight).__name__}.")
    if weight not in ds.variables:
        raise ValueError(f"weight must be {allowed}; got {weight!r}, which is not in the Dataset.")


def aggregate(ds: xr.Dataset, by: str | None = "kernel", weight=None, dim: str = "range") -> xr.Dataset:
    """Length-weighted mean over ranges, per group: the paper's per-kernel (or whole-run) Top-Down.

    Aggregate the Top-Down Dataset, not the raw metrics: node values are linear in the weights, so the
    weighted means still sum to 100; products like ``R * W`` of averaged metrics would not be the
    averages of the products.

    Parameters
    ----------
    ds : xarray.Dataset
        Usually the output of :func:`topdown` on range results.
    by : str or None
        Coordinate along ``dim`` to group by (``"kernel"`` for auto ranges, ``"name"`` for user ranges);
        None averages everything into one value.
    weight : str or xarray.DataArray, optional
        Variable or coordinate name, or values along ``dim``. Default: the first of :data:`WEIGHT_METRICS`
        present (kernel length in SM cycles, as the paper weights), else the ``weight`` coordinate along ``dim``
        (:func:`topdown` copies the first of them there), else the range duration ``end_ns - start_ns``.
    dim : str
        The dimension to aggregate over.

    Returns
    -------
    xarray.Dataset
        The data variables averaged, with dim ``by`` (or none); variable and Dataset attrs kept; coordinates
        ``weight`` (summed weight) and ``count`` (ranges) per group.

    Raises
    ------
    TypeError
        ``ds`` is not a Dataset; ``weight`` is neither a name nor a DataArray (wrap a numpy array:
        ``xr.DataArray(values, dims="range")``).
    ValueError
        ``dim`` or ``by`` not in ``ds``; ``weight`` names nothing in ``ds`` or is a DataArray not along ``dim``.
    gpuscope.errors.MissingMetricsError
        No weight can be found.
    """
    ds = _validate.dataset(ds, "ds")
    _check_weight(ds, weight, dim)
    if dim not in ds.dims:
        raise ValueError(f"the Dataset has no dimension {dim!r} (dims: {list(ds.dims)})")
    if by is not None and by not in ds.coords:
        raise ValueError(f"no coordinate {by!r} to group by; coordinates: {list(ds.coords)}")
    w = _weights(ds, weight, dim)
    # per-range coords (and axes such as the launch shape's 'xyz' that only they use) do not survive averaging
    data = ds.drop_vars([c for c in ds.coords if c != by])
    weighted = data * w
    if by is None:
        total, wsum, count = weighted.sum(dim), w.sum(dim), ds.sizes[dim]
    else:
        total = weighted.groupby(by).sum(dim)
        wsum = w.drop_vars([c for c in w.coords if c != by]).assign_coords({by: ds[by]}).groupby(by).sum(dim)
        count = ds[by].groupby(ds[by]).count()
    out = (total / wsum).assign_coords(weight=wsum, count=count)
    for name in out.data_vars:
        out[name].attrs = ds[name].attrs
    out.attrs = dict(ds.attrs)
    return out
