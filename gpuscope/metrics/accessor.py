"""The ``ds.gpuscope`` accessor: stores only the Dataset and delegates to the pure functions.

Importing this module registers the accessor (``import gpuscope`` does so lazily).
"""

from __future__ import annotations

import xarray as xr

from gpuscope.metrics import phases as _phases
from gpuscope.metrics import plot as _plot
from gpuscope.metrics import topdown as _topdown

__all__ = ["GpuscopeAccessor", "PlotNamespace"]


@xr.register_dataset_accessor("gpuscope")
class GpuscopeAccessor:
    """``ds.gpuscope.topdown()``, ``ds.gpuscope.phases()``, ``ds.gpuscope.aggregate()``, ``ds.gpuscope.plot``."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def topdown(self, levels=(1, 2, 3), arch=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.topdown.topdown` of this Dataset."""
        return _topdown.topdown(self._ds, levels, arch, **kwargs)

    def phases(self, metrics=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.phases.phases` of this Dataset."""
        return _phases.phases(self._ds, metrics, **kwargs)

    def aggregate(self, by="kernel", weight=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.topdown.aggregate` of this Dataset."""
        return _topdown.aggregate(self._ds, by, weight, **kwargs)

    @property
    def plot(self) -> PlotNamespace:
        """Plots: ``topdown``, ``timeline``, ``hierarchy``."""
        return PlotNamespace(self._ds)


class PlotNamespace:
    """``ds.gpuscope.plot.*``: the functions of :mod:`gpuscope.metrics.plot` bound to one Dataset."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def topdown(self, level=1, **kwargs):
        """:func:`gpuscope.metrics.plot.topdown` (stacked bars per range or kernel)."""
        return _plot.topdown(self._ds, level, **kwargs)

    def timeline(self, metrics=None, **kwargs):
        """:func:`gpuscope.metrics.plot.timeline` (metrics over time, phases shaded, range bands)."""
        return _plot.timeline(self._ds, metrics, **kwargs)

    def hierarchy(self, **kwargs):
        """:func:`gpuscope.metrics.plot.hierarchy` (icicle chart of the tree)."""
        return _plot.hierarchy(self._ds, **kwargs)
