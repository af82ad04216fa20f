"""Phase labels of segments: recurring segments share a label, and short excursions join the phase beside them.

Steps 4 and 5 of the method of :func:`gpuscope.metrics.phases.phases` (docs/phases.md): greedy Ward merging of
standardised segment means (:func:`label_segments`), then absorption of short segments that deviate from a
neighbouring phase less than that phase does by itself (:func:`_absorb_excursions`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["label_segments"]

# A segment is an excursion of a neighbouring phase only if that phase is at least this many times longer: its
# largest deviation over as many blocks is then the extreme of at least this many disjoint windows.
_EXCURSION_WINDOWS = 20


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
