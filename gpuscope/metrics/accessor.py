"""The ``ds.gpuscope`` accessor: stores only the Dataset and delegates to the pure functions.

Importing this module registers the accessor (``import gpuscope`` does so lazily, when xarray is first imported).
It imports nothing of gpuscope at import time: the hook that imports it runs inside whatever import first brought
in xarray, which may be one of the analysis modules, half initialised at that moment (``from
gpuscope.metrics.plot_roofline import si`` as a script's first import). Each method imports its module when called.
"""

from __future__ import annotations

import importlib

import xarray as xr

__all__ = ["GpuscopeAccessor", "PlotNamespace"]


def _m(name: str):
    """The module ``gpuscope.metrics.<name>``, imported on first use."""
    return importlib.import_module(f"gpuscope.metrics.{name}")


@xr.register_dataset_accessor("gpuscope")
class GpuscopeAccessor:
    """``ds.gpuscope.topdown()``, ``.phases()``, ``.aggregate()``, ``.roofline()``, ``.memory_workload()``,
    ``.occupancy()``, ``.instruction_mix()``, ``.plot``."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def topdown(self, levels=(1, 2, 3), arch=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.topdown.topdown` of this Dataset."""
        return _m("topdown").topdown(self._ds, levels, arch, **kwargs)

    def phases(self, metrics=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.phases.phases` of this Dataset."""
        return _m("phases").phases(self._ds, metrics, **kwargs)

    def aggregate(self, by="kernel", weight=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.topdown.aggregate` of this Dataset."""
        return _m("topdown").aggregate(self._ds, by, weight, **kwargs)

    def roofline(self, by=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.roofline.roofline` of this Dataset."""
        return _m("roofline").roofline(self._ds, by, **kwargs)

    def memory_workload(self, by=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.memory_workload.memory_workload` of this Dataset."""
        return _m("memory_workload").memory_workload(self._ds, by, **kwargs)

    def occupancy(self, registers=None, shared_memory=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.occupancy.occupancy` of this Dataset (registers and shared memory from its
        ``registers_per_thread``, ``shared_memory_static`` and ``shared_memory_dynamic`` where not given)."""
        return _m("occupancy").occupancy(self._ds, registers, shared_memory, **kwargs)

    def instruction_mix(self, by=None, **kwargs) -> xr.Dataset:
        """:func:`gpuscope.metrics.instruction_mix.instruction_mix` of this Dataset."""
        return _m("instruction_mix").instruction_mix(self._ds, by, **kwargs)

    @property
    def plot(self) -> PlotNamespace:
        """Plots: ``topdown``, ``timeline``, ``phase_topdown``, ``hierarchy``, ``roofline``, ``memory_chart``; each
        returns its ``matplotlib.figure.Figure``."""
        return PlotNamespace(self._ds)


class PlotNamespace:
    """``ds.gpuscope.plot.*``: the functions of :mod:`gpuscope.metrics.plot` bound to one Dataset."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def topdown(self, level=1, **kwargs):
        """:func:`gpuscope.metrics.plot.topdown` (stacked bars per range or kernel)."""
        return _m("plot").topdown(self._ds, level, **kwargs)

    def timeline(self, metrics=None, **kwargs):
        """:func:`gpuscope.metrics.plot.timeline` (metrics over time, phases shaded, range bands)."""
        return _m("plot").timeline(self._ds, metrics, **kwargs)

    def phase_topdown(self, per_phase, level=1, **kwargs):
        """:func:`gpuscope.metrics.plot.phase_topdown` of these phases (the result of ``gs.phases``) and
        *per_phase* (``gs.dynamic(td, phases=...)``): phase bands over time, a Top-Down bar per phase."""
        return _m("plot").phase_topdown(self._ds, per_phase, level, **kwargs)

    def hierarchy(self, **kwargs):
        """:func:`gpuscope.metrics.plot.hierarchy` (icicle chart of the tree)."""
        return _m("plot").hierarchy(self._ds, **kwargs)

    def roofline(self, precision=None, **kwargs):
        """:func:`gpuscope.metrics.plot.roofline` (the hierarchical roofline, kernels as points)."""
        return _m("plot").roofline(self._ds, precision, **kwargs)

    def memory_chart(self, select=None, **kwargs):
        """:func:`gpuscope.metrics.plot.memory_chart` (the memory hierarchy with the traffic on its edges)."""
        return _m("plot").memory_chart(self._ds, select, **kwargs)
