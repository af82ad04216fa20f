"""Whether a range's Top-Down gives a verdict: its passes agree, or its verdict leads by more than their disagreement.

A range whose stall passes ran differently (``consistent`` False: :mod:`gpuscope.metrics.topdown_checks`) has stall
nodes uncertain by up to ``topdown_uncertainty`` points of peak issue slots: each stall share is off by at most the
passes' spread of itself, so two nodes together by at most that share of the stall slots. Its level-2 verdict (the
node that loses the most issue slots, ``retire`` left out) still holds when it leads the next node by more than
that: no error within the uncertainty can reorder them. The same for the culprit, the largest level-3 node under the
verdict, against its siblings.

On the 82 launches of ``tests/fixtures/range/stalls_vs_ncu_gh100.npz`` (H100, a PyTorch step, CuPy and Numba
kernels; 35 of them with passes that disagree, mostly memory-bound elementwise kernels of 2-9 us whose verdict
leads by 25-87 points) the rule gave a verdict on 80 launches (100% of the GPU time, against 47 launches and 91%),
every one equal to ncu's, and a culprit on 66, every one equal to ncu's (``docs/measurements.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from gpuscope.metrics.topdown_checks import COVERAGE_TOLERANCE, SPREAD_TOLERANCE
from gpuscope.metrics.topdown_nodes import NODES, level_cut

__all__ = ["verdict_coordinates"]


def _lead(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of *values* (ranges x nodes): the index of the largest node and how far it leads the next (NaN
    where fewer than two are finite; inf where one is)."""
    filled = np.where(np.isfinite(values), values, -np.inf)
    order = np.argsort(-filled, axis=1, kind="stable")
    top = np.take_along_axis(filled, order[:, :1], axis=1)[:, 0]
    second = np.take_along_axis(filled, order[:, 1:2], axis=1)[:, 0] if values.shape[1] > 1 else \
        np.full(len(values), -np.inf)
    with np.errstate(invalid="ignore"):
        lead = np.where(np.isfinite(top), top - second, np.nan)
    return order[:, 0], lead


def verdict_coordinates(nodes: dict, quality: dict, absent: Sequence[str] = ()) -> dict[str, xr.Variable]:
    """The coordinates ``verdict_margin``, ``culprit_margin``, ``decided``, ``culprit_decided`` and ``no_verdict``
    from *nodes* (node name -> DataArray, percent of peak) and *quality* (the coordinates ``consistent``,
    ``topdown_uncertainty``, ``warp_state_coverage``, ``pass_spread`` where collected). Empty where *quality* has no
    ``consistent`` (the Dataset lacks the warp states that are no stall). *absent*: the architecture's optional
    stall metrics the Dataset lacks, which ``no_verdict`` names where the warp states fall short."""
    if "consistent" not in quality:
        return {}
    consistent = quality["consistent"]
    dims, shape = consistent.dims, np.shape(consistent)
    level2 = [n for n in level_cut(2, nodes) if n != "retire"]
    flat = lambda name: np.ravel(np.asarray(nodes[name], dtype=float))  # noqa: E731
    top, margin = _lead(np.stack([flat(n) for n in level2], axis=1))
    culprit_margin = np.full(top.shape, np.nan)
    for k, parent in enumerate(level2):
        rows = top == k
        children = [n.name for n in NODES if n.parent == parent and n.name in nodes]
        if rows.any() and children:
            culprit_margin[rows] = _lead(np.stack([flat(c)[rows] for c in children], axis=1))[1]
    ok = np.ravel(np.asarray(consistent, dtype=bool))
    uncertainty = np.ravel(np.asarray(quality["topdown_uncertainty"], dtype=float))
    with np.errstate(invalid="ignore"):
        decided = ok | (margin > uncertainty)
        culprit_decided = decided & (ok | (culprit_margin > uncertainty))
    as_var = lambda a, attrs: xr.Variable(dims, np.reshape(a, shape), attrs)  # noqa: E731
    units = nodes[level2[0]].attrs.get("units", "percent")
    return {
        "verdict_margin": as_var(margin, {"units": units, "description": "points of peak issue slots by which the "
                                          "level-2 verdict (bound_by) leads the next level-2 node"}),
        "culprit_margin": as_var(culprit_margin, {"units": units, "description": "points by which the culprit "
                                                  "leads the next stall node under the verdict"}),
        "decided": as_var(decided, {"units": "bool", "description": "the range has a verdict: consistent, or its "
                                    "verdict leads the next level-2 node by more than topdown_uncertainty"}),
        "culprit_decided": as_var(culprit_decided, {"units": "bool", "description": "the range's culprit is given: "
                                                    "consistent, or it leads its siblings by more than "
                                                    "topdown_uncertainty"}),
        "no_verdict": as_var(_reasons(~decided, quality, margin, uncertainty, absent), {
            "description": "why the range has no verdict (decided False): which check failed and by how much; "
                           "empty where it has one. Next steps: docs/topdown.md, 'Launches without a verdict'"}),
    }


def _reasons(undecided, quality, margin, uncertainty, absent=()) -> np.ndarray:
    cover = np.ravel(np.asarray(quality["warp_state_coverage"], dtype=float))
    spread = quality.get("pass_spread")
    apart = np.ravel(np.asarray(spread, dtype=float)) if spread is not None else np.full(cover.shape, np.nan)
    out = []
    for i in range(len(cover)):
        if not undecided[i]:
            out.append("")
            continue
        why = []
        if not abs(cover[i] - 100.0) <= COVERAGE_TOLERANCE:
            why.append(f"warp states cover {cover[i]:.0f}% of warp-active cycles (not 100 +/- {COVERAGE_TOLERANCE:g}%)"
                       + (f": collect {' and '.join(absent)} too, the stall reason that holds the rest of a "
                          "warpgroup-MMA kernel's (one more pass)" if absent and cover[i] < 100.0 else ""))
        if apart[i] > SPREAD_TOLERANCE:
            why.append(f"stall passes ran {apart[i]:.0f}% apart (pass_spread over {SPREAD_TOLERANCE:g}%)")
        if np.isfinite(margin[i]):
            why.append(f"the two leading level-2 nodes are {margin[i]:.1f} points apart, within the "
                       f"{uncertainty[i]:.1f} points this leaves uncertain")
        out.append("; ".join(why))
    return np.array(out, dtype=str)
