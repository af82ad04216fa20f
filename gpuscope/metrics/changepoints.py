"""Change points of a multivariate series: penalised binary segmentation (L2 cost) of noise-standardised metrics.

Steps 2 and 3 of the method of :func:`gpuscope.metrics.phases.phases` (docs/phases.md has the reasons and the
measurements): each metric is standardised by its noise level (:func:`standardize`), a :class:`_Splitter` finds
the best single split of a segment from cumulative sums, binary segmentation splits while the gain pays
:func:`default_penalty`, and the change points are refined between their neighbours. For phases, change points
found on block means are then pruned to the steps that matter (:func:`_prune_small_changes`) and placed at the best
sample within their block (:func:`_place_within_blocks`).

Self-contained numpy: no ``ruptures`` dependency (1e6 samples x 8 metrics in well under a second).
"""

from __future__ import annotations

import heapq
from statistics import NormalDist

import numpy as np

from gpuscope._util import validate as _validate

__all__ = ["change_points", "default_penalty", "standardize"]

# Above this many samples the noise scale is estimated from an evenly strided subset (the estimate does not
# need more, and medians of 1e6 values would cost a large part of the time budget).
_SCALE_SAMPLES = 200_000
# Split searches on segments longer than this many samples start on a grid of this size.
_GRID = 20_000
# Smallest spread, in noise sigmas, that min_change measures against: a metric that moves by only a few sigma
# over the whole run (a PCIe counter that only sees the sampler's own traffic) must not make phases of noise.
_SPREAD_FLOOR = 4.0


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
