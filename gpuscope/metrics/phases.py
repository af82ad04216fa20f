"""Phases of a multivariate time series (:func:`phases`): the input checked, change points, labels and summaries joined.

Method (docs/phases.md has the reasons and the measurements)
------
0. **Input** (:func:`phases`): samples with NaN or inf in a metric are left out of detection (counted in
   ``phases_excluded_samples``), metrics without a finite value are left out, flat metrics (range below 0.1%
   of a full scale: 100% for a Top-Down node) are ignored, and fewer than 20 samples (or blocks) are one phase.
1. **Blocks**: detection runs on block means of ``resolution`` samples (default ``n // 1000``), so variation
   faster than a block is noise; change points are re-placed at the best sample within a block afterwards.
2. **Standardise** each metric by its noise level: the RMS of ``diff(x)`` without the largest 2%, over ``sqrt(2)``.
3. **Change points** by binary segmentation with the L2 (change in mean) cost from cumulative sums, O(n * d) per
   pass, refined between neighbours; penalty ``d + 2 sqrt(2 d log n) + 4 log n`` (false change in white noise
   about ``1/n``). Change points whose local step is below ``min_change`` of every metric's spread are dropped.
4. **Labels**: greedy Ward merging of segment means below the same penalty, or within ``label_tolerance`` noise
   sigmas (or ``min_change`` of the spread) in every metric; labels numbered by first appearance.
5. **Excursions** (``excursion``): a short segment joins a neighbouring phase when it deviates from it by at most
   ``excursion`` times the phase's own largest deviation over as long; see :func:`_absorb_excursions`.

Self-contained numpy: no ``ruptures`` dependency (1e6 samples x 8 metrics in well under a second). Steps 2-3 are
:mod:`gpuscope.metrics.changepoints`, steps 4-5 :mod:`gpuscope.metrics.phase_labels`, the numbers per segment and
per phase :mod:`gpuscope.metrics.phase_summary`; this module checks the input and puts them together.

Schema of :func:`phases`'s result: the input Dataset plus

* ``phase`` (along the sample dim): phase label of every sample.
* dim ``segment``: ``segment_phase``, ``segment_first``/``segment_stop`` (sample indices, stop exclusive),
  ``segment_start``/``segment_end``/``segment_duration`` (int64 ns where the samples carry ``start_ns``/``end_ns``,
  else in the units of the sample coordinate, or in samples), ``segment_mean`` (segment, metric).
* dim ``phase_id``: ``phase_duration`` (as the segments' times), ``phase_fraction`` (of the total duration),
  ``phase_segments``, ``phase_samples``, ``phase_mean`` (phase_id, metric; duration-weighted), and
  ``phase_topdown`` (phase_id, node) when the metrics allow Top-Down.
* coordinates ``metric`` (the metrics used for detection) and ``metric_units`` (each one's units).

Every variable says its ``units``: ``"ns"`` for times, ``"samples"``/``"segments"`` for counts and indices,
``"1"`` for labels and fractions, the metric's own for means.
"""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from gpuscope._util import validate as _validate
from gpuscope.errors import GpuscopeWarning, MissingMetricsError

# change_points is looked up here when phases() runs: benchmarks/bench_phases.py swaps in ruptures' searches
from gpuscope.metrics.changepoints import (
    _check_detection,
    _place_within_blocks,
    _prune_small_changes,
    _spread,
    change_points,
    default_penalty,
    standardize,
)
from gpuscope.metrics.phase_labels import _absorb_excursions, label_segments
from gpuscope.metrics.phase_summary import _clip_reach_back, _extent, _means, _phase_topdown, _segment_sums
from gpuscope.metrics.topdown_nodes import FULL_SCALE

__all__ = ["change_points", "default_penalty", "label_segments", "phases", "standardize"]

# Blocks on either side of a change point whose medians give its step (see _prune_small_changes).
_STEP_WINDOW = 10
# Fewest samples (or blocks) to detect in: the noise level is estimated from the series' own differences, and
# with fewer of them short white-noise series of a few dozen metrics split too often (docs/phases.md).
_MIN_POINTS = 20
# A metric whose whole range is below this fraction of its full scale is flat: no change in it makes a phase.
_FLAT = 1e-3


def _sample_dim(ds: xr.Dataset, dim: str | None) -> str:
    if dim is not None:
        if dim not in ds.dims:
            raise ValueError(f"the Dataset has no dimension {dim!r} (dims: {list(ds.dims)})")
        return dim
    for name in ("time", "range"):
        if name in ds.dims:
            return name
    if len(ds.dims) == 1:
        return next(iter(ds.dims))
    raise ValueError(f"cannot tell the sample dimension among {list(ds.dims)}; pass dim=")


def _metric_names(ds: xr.Dataset, dim: str, metrics) -> list[str]:
    if metrics is None:
        # "phase" is this module's own output: running phases() on its result must not detect in the labels.
        names = [
            n
            for n, v in ds.data_vars.items()
            if v.dims == (dim,) and np.issubdtype(v.dtype, np.number) and n != "phase"
        ]
        if not names:
            raise ValueError(f"no numeric 1-D metric along {dim!r} to detect phases in")
        return names
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    missing = [n for n in names if n not in ds.data_vars]
    if missing:
        raise MissingMetricsError(f"metrics not in the Dataset: {', '.join(missing)}", tuple(missing))
    bad = [n for n in names if ds[n].dims != (dim,)]
    if bad:
        raise ValueError(f"metrics must be 1-D along {dim!r}: {', '.join(bad)}")
    return names


def _finite_samples(ds: xr.Dataset, dim: str, names: list[str]):
    """(usable metrics, their values (metrics x samples), the samples finite in all of them, metrics without a
    finite value). Warns with the count of samples left out; refuses data with nothing finite."""
    xt = np.stack([np.asarray(ds[name], dtype=float) for name in names])
    finite = np.isfinite(xt)
    unusable = [name for name, f in zip(names, finite, strict=True) if not f.any()]
    if len(unusable) == len(names):
        raise ValueError(f"every metric to detect phases in is NaN or inf at every sample along {dim!r} "
                         f"({', '.join(names)}): there is nothing to find phases in. Look at how the data was "
                         "collected (ds.attrs: lost or discarded samples), or pass metrics= that have values.")
    usable = [k for k, name in enumerate(names) if name not in unusable]
    kept = np.flatnonzero(finite[usable].all(axis=0))
    if not len(kept):
        raise ValueError(f"no sample along {dim!r} has a finite value in every one of "
                         f"{', '.join(names[k] for k in usable)}: pass metrics= with fewer of them.")
    left_out = xt.shape[1] - len(kept)
    if unusable or left_out:
        bad = {names[k]: int((~finite[k]).sum()) for k in usable if not finite[k].all()}
        warnings.warn(
            (f"metrics without a finite value, left out: {', '.join(unusable)}. " if unusable else "")
            + (f"{left_out} of {xt.shape[1]} samples have NaN or inf (per metric: {bad}): left out of the detection "
               "(each takes the phase of the segment it lies in) and of the means" if left_out else ""),
            GpuscopeWarning, stacklevel=3)
    return [names[k] for k in usable], xt[usable], kept, unusable


def _flat(da: xr.DataArray, values: np.ndarray) -> bool:
    """A metric with a full scale (a Top-Down node, which carries ``ipc_max``: 100%) whose range is below ``_FLAT``
    of it. Other metrics have no such yardstick (on the H100 a tensor pipe at 0.002% of peak tells an SGEMM from an
    FMA loop)."""
    if "ipc_max" not in da.attrs:
        return False
    return not len(values) or bool(np.ptp(values) <= _FLAT * FULL_SCALE)


def _detect(xt, block, penalty, min_size, max_change_points, label_tolerance, min_change, excursion):
    """Change points (sample indices), segment labels and the penalty used, for metrics x samples ``xt`` (finite,
    none flat). Steps 0-4 of the module docstring."""
    n = xt.shape[1]
    # Detect on block means: what varies faster than a block (launch gaps, synchronisation dips) is noise at
    # the scale of phases, and the block means are closer to independent than autocorrelated raw samples.
    nb = n // block
    xb = xt[:, : nb * block].reshape(len(xt), nb, block).mean(axis=2) if block > 1 else xt
    z = standardize(xb.T)
    pen = default_penalty(nb, max(z.shape[1], 1)) if penalty is None else float(penalty)
    if z.shape[1] == 0:  # metrics that vary only within blocks
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), pen
    block_min = None if min_size is None else max(1, -(-int(min_size) // block))
    cps_b = change_points(z, penalty=pen, min_size=block_min, max_change_points=max_change_points, standardized=True)
    spread = _spread(z, cps_b)
    if min_change > 0 and len(cps_b):
        cps_b = _prune_small_changes(z, cps_b, spread, min_change, _STEP_WINDOW)
    cps = cps_b * block
    if block > 1 and len(cps):
        reach = block_min if block_min is not None else max(2, nb // 1000)  # change_points' minimum segment
        cps = _place_within_blocks(np.ascontiguousarray(standardize(xt.T).T), cps, block, reach)
    # Labels from the block means of the final segments (change points at least a block apart map to
    # distinct blocks).
    bounds_b = np.concatenate([[0], np.clip(np.rint(cps / block), 1, nb - 1), [nb]]).astype(np.int64)
    steps = np.arange(bounds_b.size)
    bounds_b = np.maximum.accumulate(bounds_b - steps) + steps  # strictly increasing, even at the edges
    sizes_b = np.diff(bounds_b)
    zmeans = np.add.reduceat(z.T, bounds_b[:-1], axis=1).T / sizes_b[:, None]
    labels = label_segments(zmeans, sizes_b, pen, label_tolerance, spread=spread, min_change=min_change)
    if excursion > 0:
        labels = _absorb_excursions(z, bounds_b, labels, excursion)
        _, first_seen, inverse = np.unique(labels, return_index=True, return_inverse=True)
        labels = np.argsort(np.argsort(first_seen))[inverse]  # numbered by first appearance again
    # A boundary between two segments of the same phase is no phase change: join them.
    new_phase = labels[1:] != labels[:-1]
    return cps[new_phase], labels[np.concatenate([[True], new_phase])], pen


def phases(
    ds: xr.Dataset,
    metrics=None,
    *,
    dim: str | None = None,
    penalty: float | None = None,
    min_size: int | None = None,
    max_change_points: int | None = None,
    label_tolerance: float = 0.5,
    resolution: int | None = None,
    min_change: float = 0.3,
    clip_first: bool = True,
    excursion: float = 3.0,
    topdown="auto",
) -> xr.Dataset:
    """Detect change points and phases in a time series (PM samples) or per-launch range results.

    Parameters
    ----------
    ds : xarray.Dataset
        Samples along ``time`` (PM sampling) or ``range`` (e.g. one kernel's launches, see
        :func:`gpuscope.metrics.phase_topdown.dynamic`).
    metrics : str or list of str, optional
        Variables to detect phases in; default every numeric 1-D variable along the sample dimension.
    dim : str, optional
        Sample dimension; default ``time``, else ``range``, else the only dimension.
    penalty, min_size, max_change_points
        See :func:`change_points`.
    label_tolerance : float
        See :func:`label_segments`.
    resolution : int, optional
        Samples per block: change points are found on block means, so phases are at least this coarse and
        variation faster than a block counts as noise. Default ``max(1, n // 1000)``, 0.1% of the run.
    min_change : float
        Smallest change that makes a new phase, as a fraction of a metric's spread over the run (its 1st to
        99th percentile of block means): a change point stays only where some metric steps by at least this
        much (medians of up to 10 blocks either side), and segments whose means differ by less than this in
        every metric share a label. Default 0.3; 0 keeps every statistically significant change.
    excursion : float
        A segment at most 1/20 as long as a neighbouring phase joins that phase when, in every metric, its mean
        deviates from the phase's mean by at most ``excursion`` times the largest deviation the phase shows by
        itself over as many samples (in the same direction): a streaming phase that slows down for a few ms
        stays one phase, while a short phase unlike its neighbours stays apart. Default 3; 0 turns this off.
    clip_first : bool
        A PM series' first sample starts when sampling was armed, often long before the workload (its
        ``start_ns`` reaches back over the idle time before): count it as one median sample long in durations
        and fractions, so that it does not become a long idle phase. Only applies when the first sample lasts
        more than twice the median.
    topdown : {"auto", True, False}
        Add ``phase_topdown`` (per-phase Top-Down): "auto" when the metrics allow it, True to require it.

    Returns
    -------
    xarray.Dataset
        ``ds`` plus the phase variables described in the module docstring; attrs ``phases_excluded_samples``
        (samples left out of detection for NaN or inf) and ``phases_unusable_metrics`` (no finite value).

    Raises
    ------
    TypeError
        ``ds`` is not a Dataset, or a parameter has the wrong type.
    ValueError
        No sample dimension, no samples, no usable metric, every metric NaN or inf throughout (or no sample finite
        in all of them), ``metrics=[]``, ``resolution`` above the number of samples, ``penalty``,
        ``label_tolerance``, ``min_change`` or ``excursion`` negative or NaN, ``topdown`` not "auto"/True/False.
    gpuscope.errors.MissingMetricsError
        A requested metric is not in ``ds``; with ``topdown=True``, the Top-Down metrics are missing.

    Warns
    -----
    gpuscope.errors.GpuscopeWarning
        Samples or metrics left out for NaN or inf (with counts); fewer than 20 samples or blocks, or every
        metric flat: one phase.
    """
    ds = _validate.dataset(ds, "ds")
    _check_detection(penalty, min_size, max_change_points)
    label_tolerance = _validate.real(label_tolerance, "label_tolerance", minimum=0.0)
    topdown = _validate.choice(topdown, "topdown", ("auto", True, False))
    if metrics is not None:
        metrics = _validate.names(metrics, "metrics")
    if dim is not None and not isinstance(dim, str):
        raise TypeError(f"dim must be a dimension name (str) or None; got {dim!r}.")
    dim = _sample_dim(ds, dim)
    n = ds.sizes[dim]
    if n == 0:
        raise ValueError(f"ds has no samples along {dim!r}: there is nothing to find phases in.")
    block = None if resolution is None else _validate.positive_int(resolution, "resolution", maximum=n)
    min_change = _validate.real(min_change, "min_change", minimum=0.0)
    excursion = _validate.real(excursion, "excursion", minimum=0.0)
    names = _metric_names(ds, dim, metrics)
    names, xt, kept, unusable = _finite_samples(ds, dim, names)
    m = len(kept)
    block = max(1, m // 1000) if block is None else block
    nb = m // block
    detect = [k for k, name in enumerate(names) if not _flat(ds[name], xt[k, kept])]
    if nb < _MIN_POINTS:
        why = f"{m} samples" if block == 1 else f"{nb} blocks of {block} samples"
        warnings.warn(f"{why} along {dim!r} are too few to tell a change from noise (phases needs at least "
                      f"{_MIN_POINTS}, since the noise level is estimated from the series itself): one phase",
                      GpuscopeWarning, stacklevel=2)
        detect = []
    elif not detect:
        warnings.warn(f"every metric is constant or varies by less than {_FLAT:.1%} of its full scale: one "
                      "phase", GpuscopeWarning, stacklevel=2)
    cps, labels = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    pen = default_penalty(max(nb, 2), max(len(detect), 1)) if penalty is None else float(penalty)
    if detect:
        cps, labels, pen = _detect(xt[np.ix_(detect, kept)], block, penalty, min_size, max_change_points,
                                   label_tolerance, min_change, excursion)
        cps = kept[cps]  # a left-out sample belongs to the segment it lies in
    bounds = np.concatenate([[0], cps, [n]]).astype(np.int64)
    first, stop = bounds[:-1], bounds[1:]
    sizes = stop - first
    n_phases = int(labels.max()) + 1

    start, end, units = _extent(ds, dim)
    if clip_first:
        start = _clip_reach_back(start, end)
    durations = (end - start).astype(float)  # the weights of the means
    seg_start, seg_end = start[first], end[stop - 1]
    seg_dur = seg_end - seg_start
    phase_dur = np.bincount(labels, weights=seg_dur, minlength=n_phases)
    if np.issubdtype(seg_dur.dtype, np.integer):  # whole ns stay whole: sums of them are exact in float64
        phase_dur = np.rint(phase_dur).astype(np.int64)
    sums = _segment_sums(xt, durations, first)
    each_unit = [str(ds[m].attrs.get("units", "")) or "1" for m in names]
    metric_units = each_unit[0] if len(set(each_unit)) == 1 else "the metric's (coordinate metric_units)"

    def span(what):
        return {"units": units, "description": what}

    out = ds.assign(
        phase=((dim,), np.repeat(labels, sizes), {"units": "1", "description": "phase label of each sample"}),
        segment_phase=("segment", labels, {"units": "1", "description": "phase label of the segment"}),
        segment_first=("segment", first, {"units": "samples", "description": "first sample index"}),
        segment_stop=("segment", stop, {"units": "samples", "description": "sample index after the last"}),
        segment_start=("segment", seg_start, span("start of the segment's first sample")),
        segment_end=("segment", seg_end, span("end of the segment's last sample")),
        segment_duration=("segment", seg_dur, span("segment_end - segment_start")),
        segment_mean=(("segment", "metric"), _means(*sums), {
            "units": metric_units, "description": "duration-weighted mean of each metric, in the metric's units"}),
        phase_duration=("phase_id", phase_dur, span("sum of the phase's segment durations")),
        phase_fraction=("phase_id", phase_dur / phase_dur.sum() if phase_dur.sum() else phase_dur.astype(float),
                        {"units": "1", "description": "the phase's part of the total duration"}),
        phase_segments=("phase_id", np.bincount(labels, minlength=n_phases),
                        {"units": "segments", "description": "segments labelled with the phase"}),
        phase_samples=("phase_id", np.bincount(labels, weights=sizes, minlength=n_phases).astype(np.int64),
                       {"units": "samples", "description": "samples in the phase's segments"}),
        phase_mean=(("phase_id", "metric"), _means(*sums, labels, n_phases), {
            "units": metric_units, "description": "duration-weighted mean of each metric, in the metric's units"}),
    ).assign_coords(segment=("segment", np.arange(len(sizes)), {"units": "1"}),
                    phase_id=("phase_id", np.arange(n_phases), {"units": "1"}), metric=names)
    out = out.assign_coords(metric_units=("metric", each_unit, {"description": "each metric's units"}))
    if topdown is not False:
        td = _phase_topdown(ds, first, durations, labels, n_phases, topdown)
        if td is not None:
            out = out.assign(phase_topdown=td)
    out.attrs = {**ds.attrs, "phases_dim": dim, "phases_penalty": pen, "phases_change_points": len(cps),
                 "phases_resolution": block, "phases_min_change": float(min_change),
                 "phases_excursion": float(excursion), "phases_excluded_samples": n - len(kept),
                 "phases_unusable_metrics": unusable}
    return out
