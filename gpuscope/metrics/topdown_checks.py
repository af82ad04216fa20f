"""Consistency checks of a Top-Down: every level cut sums to 100%, and the warp states cover the active cycles."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from gpuscope.errors import GpuscopeWarning
from gpuscope.metrics.architectures import NOT_STALLS, Architecture, stall_metric
from gpuscope.metrics.topdown_nodes import _BY_NAME, FULL_SCALE, level_cut

__all__ = ["COVERAGE_TOLERANCE", "LEVEL_TOLERANCE", "SPREAD_TOLERANCE", "check_levels", "pass_spread"]

#: Percentage points by which the collected warp states may miss (or exceed) 100% before gpuscope warns.
#: Values from different replay passes do not add up exactly, so this cannot be tight.
COVERAGE_TOLERANCE = 5.0

#: Percent by which the active warp-cycles of the stall passes (:func:`pass_spread`) may differ before a range's
#: stall breakdown is called inconsistent. Under it, short kernels' shares agreed with ncu's within about a point
#: (docs/measurements.md); each share is uncertain by about this fraction of itself.
SPREAD_TOLERANCE = 10.0

#: Percentage points (of IPC_MAX) by which a level cut may miss 100, or a node may go below zero, before
#: :func:`check_levels` complains. Replay (issued - executed) is a small difference of numbers from different
#: passes, so it can come out slightly negative.
LEVEL_TOLERANCE = 2.0


def warp_state_coverage(ds: xr.Dataset, arch: Architecture) -> xr.Variable | None:
    """The collected warp states of every range as a share of its warp-active cycles (%), or None where ``ds``
    lacks ``selected`` and ``not_selected`` (the states that are no stall)."""
    if not all(stall_metric(r) in ds for r in NOT_STALLS):
        return None
    reasons = (*arch.stall_reasons, *arch.optional_stall_reasons, *NOT_STALLS)
    return sum(ds[m].variable.astype(float) for r in reasons if (m := stall_metric(r)) in ds)


def pass_spread(ds: xr.Dataset) -> xr.Variable | None:
    """How differently the stall passes of every range ran (%): the spread (max - min) of the warp-active counters
    that gpuscope's pass plan collects one per stall pass (Dataset attr ``pass_anchors``, the first pass's first)
    over the first one's value. None where ``ds`` holds fewer than two of them (CUPTI's own schedule, PM samples,
    chips without the counters)."""
    names = ds.attrs.get("pass_anchors", ())
    names = [n for n in ([names] if isinstance(names, str) else list(names)) if n in ds.data_vars]
    if len(names) < 2:
        return None
    values = np.stack([np.asarray(ds[n].values, dtype=float) for n in names])
    first = values[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(first > 0, 100.0 * (values.max(axis=0) - values.min(axis=0)) / first, np.nan)
    return xr.Variable(ds[names[0]].dims, spread, {
        "units": "percent", "anchors": names,  # as every Dataset variable in percent (docs/report.md)
        "description": "spread of the active warp-cycles the stall passes counted, one counter per pass "
                       f"({', '.join(names)}), over the first's: how differently the passes ran"})


def _check_coverage(ds: xr.Dataset, arch: Architecture, tolerance: float, covered=None) -> None:
    """Warn when the collected warp states fall short of 100% of warp-active cycles (the median range) and an
    optional stall reason was not collected: then the user can act (collect it). Passes that disagree are no call to act: the Top-Down's
    coordinates ``warp_state_coverage`` and ``consistent`` say which ranges they touch, and the report leaves those
    out with a note. *covered* is :func:`warp_state_coverage` where the caller has it."""
    absent = [stall_metric(r) for r in arch.optional_stall_reasons if stall_metric(r) not in ds]
    if covered is None and absent:
        covered = warp_state_coverage(ds, arch)
    if not absent or covered is None:
        return
    # a reason not collected only lowers the coverage, in every range that has it; passes that disagree scatter it
    # both ways (76-126% on a PyTorch step): only a median short of 100% is the missing reason's doing
    values = np.asarray(covered, dtype=float)
    short = 100.0 - float(np.nanmedian(values)) if np.isfinite(values).any() else 0.0
    if short > tolerance:
        warnings.warn(
            f"The collected warp states cover {float(np.nanmin(covered)):.1f}-{float(np.nanmax(covered)):.1f}% "
            f"of warp-active cycles, not 100% (tolerance {tolerance} points): a stall reason that was not "
            f"collected makes the frontend/backend split approximate. Collect {', '.join(absent)} too "
            "(required_metrics(..., optional=True)).",
            GpuscopeWarning,
            stacklevel=3,
        )


def _cut_total(td: xr.Dataset, cut) -> np.ndarray:
    """The sum of a level cut's nodes: in NumPy where the nodes share their dims (always in :func:`topdown`'s output;
    xarray's additions merge the coordinates at each step, two thirds of a Top-Down's time), else by xarray."""
    arrays = [td[n] for n in cut]
    if all(a.dims == arrays[0].dims for a in arrays):
        return sum(np.asarray(a.values, dtype=float) for a in arrays)
    return np.asarray(sum(arrays))


def check_levels(td: xr.Dataset, tolerance: float = LEVEL_TOLERANCE, on_error: str = "raise") -> dict[int, float]:
    """Check that every level cut of a Top-Down Dataset sums to 100 (percent of ``IPC_MAX``) and no node is
    negative.

    Parameters
    ----------
    td : xarray.Dataset
        Output of :func:`topdown` (or :func:`aggregate` of it).
    tolerance : float
        Allowed error in percentage points.
    on_error : {"raise", "warn"}
        Raise ``ValueError`` or emit a :class:`~gpuscope.errors.GpuscopeWarning`.

    Returns
    -------
    dict
        Level -> largest absolute deviation of its cut from 100, in points (NaN entries are ignored).

    Raises
    ------
    ValueError
        With ``on_error="raise"``, when a check fails; or when ``td`` has no Top-Down nodes.
    """
    names = [n for n in td.data_vars if n in _BY_NAME]
    if not names:
        raise ValueError("not a Top-Down Dataset: none of its variables is a Top-Down node")
    deviations, problems = {}, []
    for level in sorted({_BY_NAME[n].level for n in names}):
        cut = level_cut(level, names)
        total = _cut_total(td, cut)
        dev = float(np.nanmax(np.abs(np.asarray(total) - FULL_SCALE), initial=0.0))
        deviations[level] = dev
        if dev > tolerance:
            problems.append(f"level {level} ({' + '.join(cut)}) misses 100% by up to {dev:.3g} points")
    for n in names:
        low = float(np.nanmin(np.asarray(td[n]), initial=0.0))
        if low < -tolerance:
            problems.append(f"{n} goes down to {low:.3g}%")
    if problems:
        text = (
            "Top-Down consistency check failed (tolerance "
            f"{tolerance:g} points of IPC_MAX): " + "; ".join(problems) + ". The input metrics disagree with each "
            "other (different passes or ranges combined?)."
        )
        if on_error == "raise":
            raise ValueError(text)
        warnings.warn(text, GpuscopeWarning, stacklevel=3)
    return deviations
