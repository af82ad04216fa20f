"""Phases of a multivariate time series: change points, recurring phase labels, per-phase summaries.

Method (docs/phases.md has the reasons and the measurements)
------
0. **Input** (:func:`phases`): samples with NaN or inf in a metric are left out of detection (counted in
   ``phases_excluded_samples``), metrics without a finite value are left out, flat metrics (range below 0.1%
   of a full scale: ``ipc_max``) are ignored, and fewer than 20 samples (or blocks) are one phase.
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

Self-contained numpy: no ``ruptures`` dependency (1e6 samples x 8 metrics in well under a second).

Schema of :func:`phases`'s result: the input Dataset plus

* ``phase`` (along the sample dim): phase label of every sample.
* dim ``segment``: ``segment_phase``, ``segment_first``/``segment_stop`` (sample indices, stop exclusive),
  ``segment_start``/``segment_end``/``segment_duration`` (in ns where the samples carry ``start_ns``/``end_ns``,
  else in units of the sample coordinate), ``segment_mean`` (segment, metric).
* dim ``phase_id``: ``phase_duration``, ``phase_fraction`` (of the total duration), ``phase_segments``,
  ``phase_samples``, ``phase_mean`` (phase_id, metric; duration-weighted), and ``phase_topdown``
  (phase_id, node) when the metrics allow Top-Down.
* coordinate ``metric``: the metrics used for detection.
"""

from __future__ import annotations

import heapq
import warnings
from statistics import NormalDist

import numpy as np
import xarray as xr

from gpuscope._util import validate as _validate
from gpuscope.errors import GpuscopeWarning, MissingMetricsError

__all__ = ["change_points", "default_penalty", "label_segments", "phases", "standardize"]

# Above this many samples the noise scale is estimated from an evenly strided subset (the estimate does not
# need more, and medians of 1e6 values would cost a large part of the time budget).
_SCALE_SAMPLES = 200_000
# Split searches on segments longer than this many samples start on a grid of this size.
_GRID = 20_000
# Blocks on either side of a change point whose medians give its step (see _prune_small_changes).
_STEP_WINDOW = 10
# A segment is an excursion of a neighbouring phase only if that phase is at least this many times longer: its
# largest deviation over as many blocks is then the extreme of at least this many disjoint windows.
_EXCURSION_WINDOWS = 20
# Smallest spread, in noise sigmas, that min_change measures against: a metric that moves by only a few sigma
# over the whole run (a PCIe counter that only sees the sampler's own traffic) must not make phases of noise.
_SPREAD_FLOOR = 4.0
# Fewest samples (or blocks) to detect in: the noise level is estimated from the series' own differences, and
# with fewer of them short white-noise series of a few dozen metrics split too often (docs/phases.md).
_MIN_POINTS = 20
# A metric whose whole range is below this fraction of its full scale is flat: no change in it makes a phase.
_FLAT = 1e-3


def default_penalty(n: int, d: int) -> float:
    """Gain a split must exceed: chi-square tail bound for ``d`` unit-noise metrics at level ``1/n``.

    Parameters
    ----------
    n : int
        Number of samples.
    d : int
        Number of metrics.

    Returns
    -------
    float
    """
    x = 2.0 * np.log(max(n, 2))
    return float(d + 2.0 * np.sqrt(d * x) + 2.0 * x)


def standardize(x: np.ndarray) -> np.ndarray:
    """Center each column and divide it by its noise sigma (:func:`_trimmed_scale`); drop constant columns.

    Parameters
    ----------
    x : numpy.ndarray
        Shape ``(n, d)``, or ``(n,)`` for one metric.

    Returns
    -------
    numpy.ndarray
        Shape ``(n, d')`` float64 with ``d' <= d`` (a transposed view of a C-ordered ``(d', n)`` array); NaNs
        become 0 (the column mean).
    """
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    # One metric per contiguous row: the column-wise work below is several times faster that way.
    zt = np.array(x.T, dtype=float, order="C")
    nan = np.isnan(zt)
    has_nan = bool(nan.any())
    mean = np.nanmean(zt, axis=1) if has_nan else zt.mean(axis=1)
    zt -= np.nan_to_num(mean)[:, None]
    if has_nan:
        zt[nan] = 0.0
    step = max(1, (zt.shape[1] - 1) // _SCALE_SAMPLES)
    diffs = np.diff(zt[:, ::step], axis=1)
    scale = _trimmed_scale(diffs) / np.sqrt(2.0)
    # Noise-free or mostly flat metrics have MAD 0: fall back on the spread of all differences.
    flat = ~(scale > 0)
    if flat.any() and diffs.shape[1]:
        scale[flat] = np.std(diffs[flat], axis=1) / np.sqrt(2.0)
    keep = scale > 0
    zt = zt[keep] if not keep.all() else zt
    zt /= scale[keep][:, None]
    return zt.T


# Fraction of the largest |differences| left out of the noise estimate (they straddle level changes).
_TRIM = 0.02


def _trimmed_scale(diffs: np.ndarray) -> np.ndarray:
    """Noise sigma of each row of first differences: RMS without the largest 2%.

    Not the median absolute deviation: real PM samples have frequent short dips (synchronisation gaps between
    launches) that a median ignores but that are noise at the scale of phases. Only the rare differences that
    straddle a level change are left out: ``floor(2% of k)`` of ``k``, none below 50, so that a short series does
    not lose its largest difference and look quieter than it is. The RMS is divided by its expectation for
    Gaussian noise trimmed so (``E[d^2 | |d| < c] = 1 - 2 c phi(c) / (1 - f)`` for a fraction ``f`` cut at ``c``).
    """
    k = diffs.shape[1]
    if k == 0:
        return np.zeros(diffs.shape[0])
    centred = diffs - np.median(diffs, axis=1, keepdims=True)
    drop = int(_TRIM * k)
    if not drop:
        return np.sqrt((centred**2).mean(axis=1))
    mag = np.abs(centred)
    keep = mag <= np.partition(mag, k - drop - 1, axis=1)[:, k - drop - 1 : k - drop]
    kept = np.where(keep, centred, 0.0)
    f = drop / k
    c = NormalDist().inv_cdf(1.0 - f / 2.0)
    bias = 1.0 - 2.0 * c * NormalDist().pdf(c) / (1.0 - f)
    return np.sqrt((kept**2).sum(axis=1) / np.maximum(keep.sum(axis=1), 1) / bias)


class _Splitter:
    """Best single split of ``z[a:b]`` under the L2 cost, from cumulative sums (O((b - a) * d) per call)."""

    def __init__(self, zt: np.ndarray, min_size: int):
        d, n = zt.shape
        # Metrics in rows, so that the products below run over contiguous memory.
        self.cum = np.zeros((d, n + 1))
        np.cumsum(zt, axis=1, out=self.cum[:, 1:])
        # |C_t|^2 once, so a split search needs only one pass of (2 x d) @ C[:, a:b].
        self.sq = np.einsum("ij,ij->j", self.cum, self.cum)
        self.min_size = min_size

    def gain_at(self, a: int, t: int, b: int) -> float:
        c = self.cum
        left, right, total = c[:, t] - c[:, a], c[:, b] - c[:, t], c[:, b] - c[:, a]
        return float(left @ left / (t - a) + right @ right / (b - t) - total @ total / (b - a))

    def _gains(self, a: int, b: int, lo: int, hi: int, step: int) -> np.ndarray:
        """Gain of splitting ``[a, b)`` at ``t = lo, lo + step, ... <= hi``."""
        c, ca = self.cum, self.cum[:, a]
        total = c[:, b] - ca
        proj = np.stack([ca, total]) @ c[:, lo : hi + 1 : step]  # C_t . C_a and C_t . T
        # |L|^2 = |C_t|^2 - 2 C_t.C_a + |C_a|^2 ; L.T = C_t.T - C_a.T ; |R|^2 = |T|^2 - 2 L.T + |L|^2
        left_sq = self.sq[lo : hi + 1 : step] - 2.0 * proj[0] + ca @ ca
        left_dot = proj[1] - ca @ total
        tt = total @ total
        nl = np.arange(lo - a, hi - a + 1, step, dtype=float)
        return left_sq / nl + (tt - 2.0 * left_dot + left_sq) / ((b - a) - nl) - tt / (b - a)

    def best(self, a: int, b: int) -> tuple[int, float]:
        lo, hi = a + self.min_size, b - self.min_size
        if hi < lo:
            return -1, 0.0
        # Long segments: search a grid first, then every sample around the grid's best point. The gain is a
        # smooth curve plus a random walk, so this finds the same split at a fraction of the memory traffic.
        step = max(1, (hi - lo) // _GRID)
        if step > 1:
            t = lo + step * int(np.argmax(self._gains(a, b, lo, hi, step)))
            lo, hi = max(lo, t - step), min(hi, t + step)
        gain = self._gains(a, b, lo, hi, 1)
        k = int(np.argmax(gain))
        return lo + k, float(gain[k])


def _binary_segmentation(split: _Splitter, n: int, penalty: float, max_cps: int | None) -> list[int]:
    heap: list[tuple[float, int, int, int]] = []

    def push(a: int, b: int) -> None:
        t, g = split.best(a, b)
        if t >= 0 and g > penalty:
            heapq.heappush(heap, (-g, a, t, b))

    push(0, n)
    cps: list[int] = []
    while heap and (max_cps is None or len(cps) < max_cps):
        _, a, t, b = heapq.heappop(heap)
        cps.append(t)
        push(a, t)
        push(t, b)
    return sorted(cps)


def _refine(split: _Splitter, cps: list[int], n: int, penalty: float, sweeps: int = 2) -> list[int]:
    """Re-place each change point between its neighbours, then drop those that no longer pay the penalty."""
    cps = list(cps)
    for _ in range(sweeps):
        for k in range(len(cps)):
            a = cps[k - 1] if k else 0
            b = cps[k + 1] if k + 1 < len(cps) else n
            t, _ = split.best(a, b)
            if t >= 0:
                cps[k] = t
    while cps:
        bounds = [0, *cps, n]
        gains = [split.gain_at(bounds[k], bounds[k + 1], bounds[k + 2]) for k in range(len(cps))]
        k = int(np.argmin(gains))
        if gains[k] > penalty:
            break
        del cps[k]
    return cps


def _spread(z: np.ndarray, cps: np.ndarray) -> np.ndarray:
    """Spread of each standardised metric over the run: 1st to 99th percentile of its piecewise-constant fit
    (segment means between ``cps``), at least one noise sigma.

    The yardstick of ``min_change``: a step that is small against what the metric does over the whole run is no
    new phase, however significant statistically. The fit rather than the samples, so that noise does not
    widen the yardstick; percentiles, so that segments shorter than 1% of the run do not either.
    """
    bounds = np.concatenate([[0], cps, [z.shape[0]]]).astype(np.int64)
    means = np.add.reduceat(z, bounds[:-1], axis=0) / np.diff(bounds)[:, None]
    fit = np.repeat(means, np.diff(bounds), axis=0)
    lo, hi = np.quantile(fit, [0.01, 0.99], axis=0)
    return np.maximum(hi - lo, _SPREAD_FLOOR)


def _prune_small_changes(
    z: np.ndarray, cps: np.ndarray, spread: np.ndarray, min_change: float, window: int
) -> np.ndarray:
    """Drop change points whose local step is below ``min_change`` of every metric's spread, weakest first.

    The step is the difference of the medians of up to ``window`` blocks on either side (not beyond the
    neighbouring change points): medians, because real PM series dip for single blocks where the workload
    synchronises; local, so that a slow drift, which binary segmentation cuts into a staircase, has small steps
    and stays one phase while the jumps at its ends stay.
    """
    n = z.shape[0]
    cps = [int(c) for c in cps]

    def step(k: int) -> float:
        a = cps[k - 1] if k else 0
        b = cps[k + 1] if k + 1 < len(cps) else n
        c = cps[k]
        left = np.median(z[max(a, c - window) : c], axis=0)
        right = np.median(z[c : min(b, c + window)], axis=0)
        return float(np.max(np.abs(right - left) / spread))

    steps = [step(k) for k in range(len(cps))]
    while cps:
        k = int(np.argmin(steps))
        if steps[k] >= min_change:
            break
        del cps[k], steps[k]
        for j in (k - 1, k):  # only the neighbours' windows changed
            if 0 <= j < len(cps):
                steps[j] = step(j)
    return np.asarray(cps, dtype=np.int64)


def _place_within_blocks(zt: np.ndarray, cps: np.ndarray, block: int, reach: int) -> np.ndarray:
    """Move change points found on block means to the best sample within ``reach`` blocks of where they were
    found.

    ``reach`` is the minimum segment length on blocks: a change closer than that to the start or end of the run
    (the GPU starting 1.5 ms after sampling) can only be found that far in. A level change inside a block gives
    that block an intermediate mean, so it can be found on both sides of it, up to the minimum segment length
    further: of two change points within ``reach + 1`` blocks of each other, the weaker goes.
    """
    n = zt.shape[1]
    mean = zt.mean(axis=1, keepdims=True)
    split = _Splitter(zt - mean, 1)
    cps = [int(c) for c in cps]
    for k in range(len(cps)):
        a = cps[k - 1] if k else 0
        b = cps[k + 1] if k + 1 < len(cps) else n
        lo, hi = max(a + 1, cps[k] - reach * block), min(b - 1, cps[k] + reach * block)
        if lo <= hi:
            cps[k] = lo + int(np.argmax(split._gains(a, b, lo, hi, 1)))
    k = 0
    while k + 1 < len(cps):
        if cps[k + 1] - cps[k] <= (reach + 1) * block:
            bounds = [0, *cps, n]
            first = split.gain_at(bounds[k], bounds[k + 1], bounds[k + 2])
            second = split.gain_at(bounds[k + 1], bounds[k + 2], bounds[k + 3])
            del cps[k + 1 if first >= second else k]
        else:
            k += 1
    return np.asarray(cps, dtype=np.int64)


def _window_range(z: np.ndarray, bounds: np.ndarray, labels: np.ndarray, label: int, m: int):
    """Smallest and largest mean of ``m`` consecutive rows of ``z`` inside phase ``label`` (windows run over
    consecutive segments of that phase, not across other phases), per column; None when no stretch of the
    phase is ``m`` rows long."""
    lo = hi = None
    edges = np.flatnonzero(np.diff(np.concatenate([[0], labels == label, [0]]).astype(np.int8)))
    for first, stop in zip(edges[::2], edges[1::2]):  # runs of segments with this label
        part = z[bounds[first] : bounds[stop]]
        if len(part) < m:
            continue
        cum = np.concatenate([np.zeros((1, z.shape[1])), np.cumsum(part, axis=0)])
        means = (cum[m:] - cum[:-m]) / m
        a, b = means.min(axis=0), means.max(axis=0)
        lo, hi = (a, b) if lo is None else (np.minimum(lo, a), np.maximum(hi, b))
    return lo, hi


def _absorb_excursions(z: np.ndarray, bounds: np.ndarray, labels: np.ndarray, factor: float) -> np.ndarray:
    """Relabel short segments that deviate from a neighbouring phase less than that phase does by itself.

    A segment of ``m`` blocks next to phase ``P`` takes label ``P`` when, in every metric, its mean lies within
    ``factor`` times ``P``'s own largest deviation (from ``P``'s mean, on the same side) over ``m`` consecutive
    blocks of ``P``: ``P`` alone moves nearly that far over that time, so the segment is ``P``'s own variation
    (a streaming phase that slows down for a few ms), not new behaviour. The yardstick is the phase's own
    windowed means, so it needs no noise model: with autocorrelated or heavy-tailed noise they spread widely,
    with white noise they concentrate as ``1/sqrt(m)`` and a real change stays. ``P`` must be at least
    ``_EXCURSION_WINDOWS`` times longer than the segment, so that its largest deviation is the extreme of that
    many disjoint windows. Shortest segments first; an absorbed segment joins its phase's reference and is not
    moved again (a segment within reach of the phases on both sides would otherwise swing between them forever).
    """
    labels = labels.copy()
    sizes = np.diff(bounds)
    sums = np.add.reduceat(z, bounds[:-1], axis=0)
    means = sums / sizes[:, None]
    rejected: set[tuple[int, int]] = set()  # (segment, phase) pairs tested against the phase as it is now

    def joins(s: int, p: int) -> bool:
        same = labels == p
        if (s, p) in rejected or sizes[same].sum() < _EXCURSION_WINDOWS * sizes[s]:
            return False
        lo, hi = _window_range(z, bounds, labels, p, int(sizes[s]))
        if lo is None:
            return False
        centre = sums[same].sum(axis=0) / sizes[same].sum()
        dev = means[s] - centre
        reach = np.maximum(np.where(dev > 0, hi - centre, centre - lo), 0.0)
        if np.all(np.abs(dev) <= factor * reach):
            return True
        rejected.add((s, p))
        return False

    order = np.argsort(sizes, kind="stable")
    absorbed: set[int] = set()  # a segment changes phase once: one between two phases could join each in turn
    changed = True
    while changed:
        changed = False
        for s in order:
            if s in absorbed:
                continue
            p = next((labels[j] for j in (s - 1, s + 1)
                      if 0 <= j < len(sizes) and labels[j] != labels[s] and joins(s, labels[j])), None)
            if p is not None:
                rejected = {(t, q) for t, q in rejected if q not in (p, labels[s])}  # both references changed
                labels[s] = p
                absorbed.add(int(s))
                changed = True
                break
    return labels


def _check_detection(penalty, min_size, max_change_points) -> None:
    """TypeError/ValueError for detection parameters that would misbehave (NaN penalty, fractional sizes)."""
    if penalty is not None:
        _validate.real(penalty, "penalty", minimum=0.0)
    if min_size is not None:
        _validate.positive_int(min_size, "min_size")
    if max_change_points is not None:
        _validate.integer(max_change_points, "max_change_points", minimum=0)


def change_points(
    x: np.ndarray,
    *,
    penalty: float | None = None,
    min_size: int | None = None,
    max_change_points: int | None = None,
    standardized: bool = False,
) -> np.ndarray:
    """Indices where a new segment starts, for a multivariate series of shape ``(n, d)``.

    Parameters
    ----------
    x : numpy.ndarray
        Samples by metrics (a 1-D array is one metric).
    penalty : float, optional
        Minimum decrease of the squared error (in noise-sigma units) for a change point; default
        :func:`default_penalty`. Raise it for autocorrelated or drifting data.
    min_size : int, optional
        Minimum segment length in samples; default ``max(2, n // 1000)``.
    max_change_points : int, optional
        Keep at most this many (the strongest first).
    standardized : bool
        ``x`` is already standardised (skip :func:`standardize`).

    Returns
    -------
    numpy.ndarray
        Sorted int64 indices in ``(0, n)``.

    Raises
    ------
    TypeError
        A parameter of the wrong type (``min_size=2.5``).
    ValueError
        ``min_size`` below 1, ``max_change_points`` negative, or ``penalty`` negative, NaN or infinite.
    """
    _check_detection(penalty, min_size, max_change_points)
    z = np.asarray(x, dtype=float) if standardized else standardize(x)
    if z.ndim == 1:
        z = z[:, None]
    n, d = z.shape
    min_size = max(2, n // 1000) if min_size is None else int(min_size)
    penalty = default_penalty(n, max(d, 1)) if penalty is None else float(penalty)
    if d == 0 or n < 2 * min_size:
        return np.zeros(0, dtype=np.int64)
    # Centred, so that the cumulative sums stay small and precise (standardize() already did it; a copy of a
    # large array costs a good part of the time budget). Metrics in rows, see _Splitter.
    mean = z.mean(axis=0)
    split = _Splitter(z.T - mean[:, None] if np.abs(mean).max() > 1e-9 else z.T, min_size)
    cps = _binary_segmentation(split, n, penalty, max_change_points)
    return np.asarray(_refine(split, cps, n, penalty), dtype=np.int64)


def label_segments(
    means: np.ndarray,
    sizes: np.ndarray,
    penalty: float,
    label_tolerance: float = 0.5,
    *,
    spread: np.ndarray | None = None,
    min_change: float = 0.3,
) -> np.ndarray:
    """Give recurring segments one label: greedy Ward merging of standardised segment means.

    Parameters
    ----------
    means : numpy.ndarray
        ``(k, d)`` standardised segment means.
    sizes : numpy.ndarray
        ``(k,)`` segment lengths in samples.
    penalty : float
        Merge while the Ward cost is below this.
    label_tolerance : float
        Also merge while every metric's means differ by less than this many noise sigmas.
    spread : numpy.ndarray, optional
        ``(d,)`` spread of each metric over the run (same units as ``means``); with ``min_change``, also merge
        while every metric's means differ by less than ``min_change * spread``.
    min_change : float
        See ``spread``; 0 turns this criterion off.

    Returns
    -------
    numpy.ndarray
        ``(k,)`` int64 labels numbered by first appearance.
    """
    means = np.asarray(means, dtype=float).reshape(len(sizes), -1)
    centers, weight = means.copy(), np.asarray(sizes, dtype=float).copy()
    members = [[i] for i in range(len(sizes))]
    alive = np.ones(len(sizes), dtype=bool)
    while alive.sum() > 1:
        idx = np.flatnonzero(alive)
        diff = centers[idx, None, :] - centers[None, idx, :]
        w = weight[idx]
        ward = w[:, None] * w[None, :] / (w[:, None] + w[None, :]) * np.einsum("ijk,ijk->ij", diff, diff)
        close = np.abs(diff).max(axis=2) < label_tolerance
        if spread is not None and min_change > 0:
            close |= (np.abs(diff) / spread).max(axis=2) < min_change
        # Pairs within tolerance go first (cost -1), then by Ward cost.
        cost = np.where(close, -1.0, ward)
        np.fill_diagonal(cost, np.inf)
        i, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
        if cost[i, j] >= penalty:
            break
        a, b = idx[i], idx[j]
        centers[a] = (weight[a] * centers[a] + weight[b] * centers[b]) / (weight[a] + weight[b])
        weight[a] += weight[b]
        members[a] += members[b]
        alive[b] = False
    labels = np.empty(len(sizes), dtype=np.int64)
    for cluster in (members[i] for i in np.flatnonzero(alive)):
        labels[cluster] = cluster[0]
    _, first = np.unique(labels, return_index=True)
    order = {labels[f]: rank for rank, f in enumerate(sorted(first))}
    return np.array([order[v] for v in labels], dtype=np.int64)


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


def _extent(ds: xr.Dataset, dim: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every sample: start_ns/end_ns, else the coordinate (last sample as long as the one
    before), else the index."""
    n = ds.sizes[dim]
    if "start_ns" in ds.coords and "end_ns" in ds.coords and ds["start_ns"].dims == (dim,):
        return np.asarray(ds["start_ns"], dtype=float), np.asarray(ds["end_ns"], dtype=float)
    pos = np.asarray(ds[dim], dtype=float) if dim in ds.coords and np.issubdtype(ds[dim].dtype, np.number) else None
    if pos is None:
        pos = np.arange(n, dtype=float)
    step = np.diff(pos)
    end = np.append(pos[1:], pos[-1] + (step[-1] if len(step) else 1.0))
    return pos, end


def _clip_reach_back(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Start of the first sample moved to one median duration before its end, when it lasts over twice that."""
    if len(start) < 3:
        return start
    typical = float(np.median(end[1:] - start[1:]))
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
    """A metric with a full scale (``ipc_max`` of a Top-Down node) whose range is below ``_FLAT`` of it. Other
    metrics have no such yardstick (on the H100 a tensor pipe at 0.002% of peak tells an SGEMM from an FMA loop)."""
    scale = da.attrs.get("ipc_max")
    return bool(scale) and (not len(values) or bool(np.ptp(values) <= _FLAT * float(scale)))


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

    start, end = _extent(ds, dim)
    if clip_first:
        start = _clip_reach_back(start, end)
    durations = end - start
    seg_start, seg_end = start[first], end[stop - 1]
    seg_dur = seg_end - seg_start
    phase_dur = np.bincount(labels, weights=seg_dur, minlength=n_phases)
    sums = _segment_sums(xt, durations, first)

    out = ds.assign(
        phase=((dim,), np.repeat(labels, sizes), {"description": "phase label of each sample"}),
        segment_phase=("segment", labels),
        segment_first=("segment", first, {"description": "first sample index"}),
        segment_stop=("segment", stop, {"description": "sample index after the last"}),
        segment_start=("segment", seg_start),
        segment_end=("segment", seg_end),
        segment_duration=("segment", seg_dur),
        segment_mean=(("segment", "metric"), _means(*sums)),
        phase_duration=("phase_id", phase_dur),
        phase_fraction=("phase_id", phase_dur / phase_dur.sum() if phase_dur.sum() else phase_dur),
        phase_segments=("phase_id", np.bincount(labels, minlength=n_phases)),
        phase_samples=("phase_id", np.bincount(labels, weights=sizes, minlength=n_phases).astype(np.int64)),
        phase_mean=(("phase_id", "metric"), _means(*sums, labels, n_phases)),
    ).assign_coords(segment=np.arange(len(sizes)), phase_id=np.arange(n_phases), metric=names)
    if topdown is not False:
        td = _phase_topdown(ds, first, durations, labels, n_phases, topdown)
        if td is not None:
            out = out.assign(phase_topdown=td)
    out.attrs = {**ds.attrs, "phases_dim": dim, "phases_penalty": pen, "phases_change_points": len(cps),
                 "phases_resolution": block, "phases_min_change": float(min_change),
                 "phases_excursion": float(excursion), "phases_excluded_samples": n - len(kept),
                 "phases_unusable_metrics": unusable}
    return out
