"""Hierarchical roofline of range results: FLOP/s by precision, arithmetic intensity at L1, L2 and DRAM, ceilings.

What Nsight Compute's roofline sections compute (``SpeedOfLight_RooflineChart`` and the hierarchical single, double,
half and tensor charts), from the ``roofline`` set:

Work
    ``fp64 = dadd + dmul + 2 dfma``, ``fp32 = fadd + fmul + 2 ffma``, ``fp16 = 2 hadd + 2 hmul + 4 hfma`` over the
    ``smsp__sass_thread_inst_executed_op_*_pred_on.sum`` thread instructions (an FMA is two operations; the half
    instructions are paired HADD2/HMUL2/HFMA2, fp16 or bf16), ``tensor`` = the sum of the
    ``sm__ops_path_tensor_src_*.sum`` operations the Dataset holds (fp64, tf32, fp16, bf16, fp8 on GH100).
    FLOP/s = FLOPs / ``gpu__time_duration.sum``, the time base of ncu's ``.per_second``.
Peak work
    The FMA counter's own ``.peak_sustained`` (per cycle, all SMs) times the operations per instruction (2, or 4 for
    HFMA2), times the SM clock during the range ``sm__cycles_elapsed.avg.per_second``, as ncu's
    ``derived__sm__sass_thread_inst_executed_op_*fma_pred_on_x2`` do. The tensor peak is the ``.peak_sustained`` of
    the tensor path that did the most operations (the largest path's where none ran); on Ampere and later it
    counts structured sparsity, so a dense GEMM reaches at most half of it, as in ncu's tensor chart.
Traffic
    ``L1``: ``l1tex__lsu_writeback_active_mem_lgds.sum`` x 128 bytes (``_mem_lg`` before Hopper), ncu's
    ``derived__l1tex__lsu_writeback_bytes_mem_lgds``; ``L2``: ``lts__lts2xbar_cycles_active.sum`` x 32 bytes, ncu's
    ``derived__lts__lts2xbar_bytes`` (L2 to crossbar, the data L2 returns); ``DRAM``: ``dram__bytes.sum``. Each
    level's peak bandwidth is its counter's ``.peak_sustained`` times the same bytes, times the level's clock
    (``l1tex__``, ``lts__``, ``dram__cycles_elapsed.avg.per_second``). The 128 and 32 are bytes per active cycle of
    those interfaces, the factors ncu's section files use; the peaks themselves are the chip's.
Intensity and bound
    ``intensity = FLOPs / bytes`` per level. A level's ceiling at the kernel's intensity is ``intensity x peak
    bandwidth``; the attainable FLOP/s is the lowest of those and the peak work, and ``bound`` names which one
    (``"compute"`` or the level). ``achieved_fraction`` is FLOP/s over the attainable.

With ``by="kernel"`` the launches of a kernel are combined first (:mod:`gpuscope.metrics.combine`): FLOPs, bytes
and durations added, clocks weighted by duration.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import xarray as xr

from gpuscope.errors import MissingMetricsError
from gpuscope.metrics.combine import DURATION, combine, metric, plain, require

__all__ = ["PRECISIONS", "LEVELS", "TENSOR_PREFIX", "SM_CLOCK", "Level", "roofline", "required_metrics"]

_T = "smsp__sass_thread_inst_executed_op_"
_PEAK = "sm__sass_thread_inst_executed_op_{}_pred_on.sum.peak_sustained"
_SET = "roofline"

#: Precision -> ((thread-instruction counter, operations per instruction), ...), (peak counter, operations).
PRECISIONS: dict[str, tuple[tuple[tuple[str, float], ...], tuple[str, float]]] = {
    "fp64": (((f"{_T}dadd_pred_on.sum", 1.0), (f"{_T}dmul_pred_on.sum", 1.0), (f"{_T}dfma_pred_on.sum", 2.0)),
             (_PEAK.format("dfma"), 2.0)),
    "fp32": (((f"{_T}fadd_pred_on.sum", 1.0), (f"{_T}fmul_pred_on.sum", 1.0), (f"{_T}ffma_pred_on.sum", 2.0)),
             (_PEAK.format("ffma"), 2.0)),
    "fp16": (((f"{_T}hadd_pred_on.sum", 2.0), (f"{_T}hmul_pred_on.sum", 2.0), (f"{_T}hfma_pred_on.sum", 4.0)),
             (_PEAK.format("hfma"), 4.0)),
}
#: Tensor operations: every ``<prefix>*.sum`` counter of the Dataset, each with its ``.peak_sustained``.
TENSOR_PREFIX = "sm__ops_path_tensor_src_"
#: The SM clock during the range: peak work per second = peak per cycle x this.
SM_CLOCK = "sm__cycles_elapsed.avg.per_second"


@dataclasses.dataclass(frozen=True)
class Level:
    """A memory level of the hierarchical roofline: its counter (GH100 name; the set's alternatives stand in on
    other chips), the bytes one count moves, and the clock its peak is per cycle of."""

    name: str
    counter: str
    bytes_per_count: float
    clock: str
    description: str


LEVELS: tuple[Level, ...] = (
    Level("L1", "l1tex__lsu_writeback_active_mem_lgds.sum", 128.0, "l1tex__cycles_elapsed.avg.per_second",
          "L1/TEX cache: bytes written back to the SM for local, global and distributed shared loads"),
    Level("L2", "lts__lts2xbar_cycles_active.sum", 32.0, "lts__cycles_elapsed.avg.per_second",
          "L2 cache: bytes L2 returned through the crossbar"),
    Level("DRAM", "dram__bytes.sum", 1.0, "dram__cycles_elapsed.avg.per_second", "device memory: bytes read and written"),
)

_ATTRS = {
    "flop": ("FLOP", "floating-point operations"),
    "flop_rate": ("FLOP/second", "achieved floating-point operations per second"),
    "peak_flop_rate": ("FLOP/second", "peak floating-point operations per second at the SM clock of the range"),
    "bytes": ("byte", "bytes moved at the level"),
    "bandwidth": ("byte/second", "achieved bytes per second at the level"),
    "peak_bandwidth": ("byte/second", "peak bytes per second of the level at its clock during the range"),
    "intensity": ("FLOP/byte", "arithmetic intensity: FLOPs per byte at the level"),
    "ridge": ("FLOP/byte", "intensity where the level's bandwidth ceiling meets the peak work"),
    "attainable": ("FLOP/second", "lowest ceiling at the kernel's intensities (peak work or a level's bandwidth)"),
    "bound": ("", "which ceiling is lowest: 'compute' or the level; '' where the precision did no work"),
    "achieved_fraction": ("ratio", "achieved FLOP/s over the attainable"),
    "dominant_precision": ("", "the precision with the most FLOPs ('' where none)"),
}


def required_metrics() -> list[str]:
    """The metrics :func:`roofline` reads (GH100 names; the ``roofline`` set has them all)."""
    names = [DURATION, SM_CLOCK]
    for counters, (peak, _) in PRECISIONS.values():
        names += [c for c, _ in counters] + [peak]
    for level in LEVELS:
        names += [level.counter, level.counter + ".peak_sustained", level.clock]
    return names


def _missing(ds: xr.Dataset, names) -> MissingMetricsError:
    absent = tuple(n for n in names if metric(ds, n, _SET) is None)
    return MissingMetricsError(f"the roofline needs {', '.join(absent)}, which the Dataset does not hold. Collect the "
                               f"{_SET!r} set (gs.Profiler(metrics={_SET!r})).", absent)


def _work(ds: xr.Dataset) -> tuple[xr.DataArray, xr.DataArray]:
    """(FLOPs, peak FLOPs per cycle) along (row, precision), the precisions the Dataset has the counters of."""
    flops, peaks, labels = [], [], []
    for name, (counters, (peak, per_inst)) in PRECISIONS.items():
        found = [(metric(ds, c, _SET), k) for c, k in counters]
        peak_value = metric(ds, peak, _SET)
        if any(v is None for v, _ in found) or peak_value is None:
            continue
        flops.append(plain(sum(v * k for v, k in found)))
        peaks.append(plain(peak_value * per_inst))
        labels.append(name)
    tensor = _tensor(ds)
    if tensor is not None:
        flops.append(tensor[0])
        peaks.append(tensor[1])
        labels.append("tensor")
    if not labels:
        counters, (peak, _) = PRECISIONS["fp32"]
        raise _missing(ds, [c for c, _ in counters] + [peak])
    index = xr.DataArray(labels, dims="precision")
    return xr.concat(flops, index, coords="minimal"), xr.concat(peaks, index, coords="minimal")


def _tensor(ds: xr.Dataset) -> tuple[xr.DataArray, xr.DataArray] | None:
    """Tensor operations (all paths added) and the peak per cycle of the path that did the most of them."""
    paths = [str(n) for n in ds.data_vars if str(n).startswith(TENSOR_PREFIX) and str(n).endswith(".sum")
             and f"{n}.peak_sustained" in ds.data_vars]
    if not paths:
        return None
    ops = xr.concat([plain(ds[p]) for p in paths], "path", coords="minimal")
    peak = xr.concat([plain(ds[f"{p}.peak_sustained"]) for p in paths], "path", coords="minimal")
    ran = ops.fillna(0) > 0
    largest = peak.fillna(0).argmax("path")
    busiest = ops.fillna(0).argmax("path").where(ran.any("path"), largest)
    return ops.sum("path", min_count=1), peak.isel(path=busiest)


def _traffic(ds: xr.Dataset) -> tuple[xr.DataArray, xr.DataArray] | None:
    """(bytes, peak bytes per second) along (dim, level), the levels the Dataset has."""
    moved, peaks, labels = [], [], []
    for level in LEVELS:
        count = metric(ds, level.counter, _SET)
        peak = metric(ds, level.counter + ".peak_sustained", _SET)
        clock = metric(ds, level.clock, _SET)
        if count is None or peak is None or clock is None:
            continue
        moved.append(plain(count * level.bytes_per_count))
        peaks.append(plain(peak * level.bytes_per_count * clock))
        labels.append(level.name)
    if not labels:
        return None
    index = xr.DataArray(labels, dims="level")
    return xr.concat(moved, index, coords="minimal"), xr.concat(peaks, index, coords="minimal")


def roofline(ds: xr.Dataset, by: str | None = None, dim: str = "range") -> xr.Dataset:
    """The hierarchical roofline of each range (or group of ranges), as Nsight Compute draws it.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results holding the ``roofline`` set (or the metrics :func:`required_metrics` names).
    by : str, optional
        Combine the ranges of each value of this coordinate first (``"kernel"``: one row per kernel).
    dim : str
        The dimension of the ranges.

    Returns
    -------
    xarray.Dataset
        Along *dim* (or *by*), ``precision`` (``fp64``, ``fp32``, ``fp16``, ``tensor``: those the Dataset has) and
        ``level`` (``L1``, ``L2``, ``DRAM``: likewise): ``flop``, ``flop_rate``, ``peak_flop_rate``
        (row, precision); ``bytes``, ``bandwidth``, ``peak_bandwidth`` (row, level); ``intensity``, ``ridge``
        (row, precision, level); ``attainable``, ``bound``, ``achieved_fraction`` (row, precision);
        ``dominant_precision`` (row). Each variable has ``units`` and ``description``; the coordinates of the rows
        and the Dataset attrs are kept.

    Raises
    ------
    TypeError
        *ds* is not a Dataset.
    ValueError
        *by* or *dim* is not in *ds*.
    gpuscope.errors.MissingMetricsError
        The Dataset lacks the duration, the SM clock, every precision's counters or every level's.
    """
    ds = combine(ds, by, dim)
    row = by or dim
    base = require(ds, [DURATION, SM_CLOCK], _SET, "the roofline")
    seconds = plain(base[DURATION]) * 1e-9
    flop, peak_per_cycle = _work(ds)
    traffic = _traffic(ds)
    if traffic is None:
        raise _missing(ds, [n for lv in LEVELS for n in (lv.counter, lv.counter + ".peak_sustained", lv.clock)])
    moved, peak_bandwidth = traffic
    with np.errstate(divide="ignore", invalid="ignore"):
        flop_rate = flop / seconds
        peak_flop_rate = peak_per_cycle * plain(base[SM_CLOCK])
        bandwidth = moved / seconds
        intensity = flop / moved
        ridge = peak_flop_rate / peak_bandwidth
        ceilings = xr.concat([peak_flop_rate.expand_dims(ceiling=["compute"]),
                              (intensity * peak_bandwidth).rename(level="ceiling")], "ceiling")
        attainable = ceilings.min("ceiling", skipna=False)
        achieved_fraction = flop_rate / attainable
    did_work = flop.fillna(0) > 0
    lowest = ceilings.fillna(np.inf).argmin("ceiling")
    bound = xr.DataArray(np.asarray(ceilings["ceiling"].values)[lowest.values], dims=lowest.dims,
                         coords=lowest.coords).where(did_work, "")
    dominant = flop.fillna(0).argmax("precision")
    dominant_precision = xr.DataArray(np.asarray(flop["precision"].values)[dominant.values], dims=dominant.dims,
                                      coords=dominant.coords).where(did_work.any("precision"), "")
    out = xr.Dataset({
        "flop": flop, "flop_rate": flop_rate, "peak_flop_rate": peak_flop_rate,
        "bytes": moved, "bandwidth": bandwidth, "peak_bandwidth": peak_bandwidth,
        "intensity": intensity, "ridge": ridge, "attainable": attainable, "bound": bound.astype(str),
        "achieved_fraction": achieved_fraction.where(did_work), "dominant_precision": dominant_precision.astype(str),
    })
    out = out.assign_coords({n: c for n, c in ds.coords.items() if c.dims == (row,)}).transpose(row, ...)
    for name, (units, description) in _ATTRS.items():
        out[name].attrs = {"units": units, "description": description} if units else {"description": description}
    out.attrs = dict(ds.attrs)
    return out
