"""Compare two range-profiling runs kernel by kernel, and say which differences are larger than run-to-run noise.

Each kernel's launches (or each user range's executions) are the samples: for every quantity (GPU time per
launch, Top-Down nodes in percent of peak, throughput metrics) the two runs' per-launch values are compared with
Welch's t-test (:func:`gpuscope._util.stats.welch`, as ``scipy.stats.ttest_ind(equal_var=False)``) and its
confidence interval of the difference of means. A difference is *significant* when the test rejects "same mean"
at ``alpha`` **and** the change is larger than ``min_change`` (relative, for times, metrics and rates; in points,
for Top-Down nodes and the speed-of-light percentages: hit rates, busy shares, pipe utilisation), so that a
statistically real but negligible shift over thousands of launches is not flagged. The speed-of-light quantities
(FLOP/s by precision, bandwidths, hit rates, busy shares, pipe utilisation) are those of
:mod:`gpuscope._results.sol_quantities`, where the Datasets hold the sets they come from.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results.report_inputs import SHORT_NAMES, _finite, _kind
from gpuscope._results.report_ranges import GPU_TIME, group_key
from gpuscope._results.report_table import Report, _count, _new
from gpuscope._results.report_topdown import topdown_per_launch
from gpuscope._results.sol_quantities import per_launch
from gpuscope._util.stats import welch

__all__ = ["compare"]


def _quantities(ds) -> tuple[dict[str, np.ndarray], dict[str, str], set[str]]:
    """Per-range values of every comparable quantity, their units, and which of them change in points, not
    relative (Top-Down nodes, speed-of-light percentages): GPU time per launch, the Top-Down nodes of levels 1 to
    3, the speed-of-light quantities (roofline, memory workload, instructions), and every metric as recorded (a
    halved stall share shows in its own row and in its level-3 node, not only in level 2)."""
    from gpuscope.metrics import topdown as td

    out: dict[str, np.ndarray] = {}
    units: dict[str, str] = {}
    if GPU_TIME in ds:
        out["gpu_time_us"], units["gpu_time_us"] = np.asarray(ds[GPU_TIME].values, dtype=float) / 1e3, "us"
    nodes: set[str] = set()
    result = topdown_per_launch(ds)
    if result is not None:
        for name in dict.fromkeys(td.level_cut(1) + td.level_cut(2) + td.level_cut(3)):
            if name in result[0]:
                out[name], units[name] = np.asarray(result[0][name].values, dtype=float), "%"
                nodes.add(name)
    sol, sol_units, percent = per_launch(ds)
    out.update(sol)
    units.update(sol_units)
    nodes |= percent
    for m in ds.data_vars:
        if m != GPU_TIME and ds[m].dims == ("range",) and np.issubdtype(ds[m].dtype, np.number):
            short = SHORT_NAMES.get(m, m)
            out[short] = np.asarray(ds[m].values, dtype=float)
            units[short] = "%" if ".pct_of_peak" in m else str(ds[m].attrs.get("units", ""))
    return out, units, nodes


def _welch(a: np.ndarray, b: np.ndarray, confidence: float):
    """(p value, ci low, ci high) for mean(b) - mean(a), NaN where the data cannot tell."""
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2:
        return np.nan, np.nan, np.nan
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # no spread at all: identical is certain, a change is exact
        same = a[0] == b[0]
        return (1.0 if same else 0.0), b[0] - a[0], b[0] - a[0]
    return welch(a, b, confidence)


def compare(base, new, *, alpha: float = 0.05, min_change: float = 0.02) -> Report:
    """Per-kernel differences between two range-profiling Datasets, with significance from repeated launches.

    Parameters
    ----------
    base, new : xarray.Dataset
        Range results (dim ``range``) of the same program: the baseline and the run to judge, live or loaded
        with :func:`gpuscope.open_dataset`. Rows are matched by kernel name (launches) or range path (user ranges).
    alpha : float
        Significance level of Welch's t-test; the confidence interval is ``1 - alpha``.
    min_change : float
        Smallest change worth flagging: relative to the base mean for times, metrics and rates (0.02 = 2%), in
        points for Top-Down nodes and the speed-of-light percentages (0.02 = 2 points).

    Returns
    -------
    Report
        A DataFrame with one row per (kernel, quantity): ``base``, ``new`` (means) and ``change`` (new - base) in
        the row's ``unit``, ``relative`` (change / base, in percent), ``ci_low``/``ci_high`` (confidence interval
        of the change), ``p_value``, ``n_base``/``n_new`` (launches), ``significant`` (bool). Quantities:
        ``gpu_time_us`` per launch (us), Top-Down nodes of levels 1 to 3 in percent of peak, the speed-of-light
        quantities where the sets allow them (``roofline.flop_rate.fp32`` in FLOP/second, ``memory.hit_rate.L2``
        in percent, ``instructions.pipe_utilization.fma``, ...: :mod:`gpuscope._results.sol_quantities`), and
        every metric of the Datasets in its own unit (throughput metrics by their short names, in percent of
        peak). Kernels found in one run only get one row with the other side empty. NaN and inf values
        are no data: left out of the means and tests (``n_base``/``n_new`` count the values used) and counted in a
        note. ``print()`` shows the time rows and every significant row, fitted to the terminal; ``to_csv``
        writes every row.

    Raises
    ------
    ValueError
        A Dataset is not range results (PM and PC sampling are not compared), holds no finite metric value, or bad
        ``alpha``/``min_change``.
    gpuscope.errors.NotGpuscopeDataError
        A Dataset is not gpuscope's.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
    if not (0 <= min_change < float("inf")):  # NaN or inf would flag nothing, and --fail-on would never fail
        raise ValueError(f"min_change must be a finite number >= 0, not {min_change}")
    for label, ds in (("base", base), ("new", new)):
        kind = _kind(ds)
        if kind != "range":
            raise ValueError(f"compare() works on range-profiling results; the {label} Dataset is {kind} data. "
                             "Profile both runs with gpuscope.Profiler (or gpuscope run) and compare those.")
    notes = []
    for label, ds in (("base", base), ("new", new)):
        try:
            _, missing = _finite(ds, "range", "launch")
        except ValueError as exc:
            raise ValueError(f"the {label} Dataset: {exc}") from None
        notes += [f"{label}: {n}" for n in missing]
    (qa, units, nodes), (qb, units_b, nodes_b) = _quantities(base), _quantities(new)
    units, nodes = {**units_b, **units}, nodes | nodes_b
    ka, kb = group_key(base), group_key(new)
    kernels = list(dict.fromkeys([*ka.tolist(), *kb.tolist()]))
    common = [q for q in qa if q in qb]
    rows = []
    for k in kernels:
        in_a, in_b = ka == k, kb == k
        if not in_a.any() or not in_b.any():
            side = "base" if in_a.any() else "new"
            rows.append({"kernel": k, "quantity": f"only in {side}", "n_base": int(in_a.sum()), "n_new": int(in_b.sum()),
                         "significant": False})
            continue
        for q in common:
            a, b = qa[q][in_a], qb[q][in_b]
            a, b = a[np.isfinite(a)], b[np.isfinite(b)]  # NaN or inf is no data (counted in a note), not a value
            ma, mb = (x.mean() if x.size else np.nan for x in (a, b))
            p, lo, hi = _welch(a, b, 1 - alpha)
            change = mb - ma
            relative = 100 * change / ma if ma else np.nan
            size = abs(change) if q in nodes else abs(relative)  # points, or percent of the base
            rows.append({"kernel": k, "quantity": q, "unit": units[q], "base": ma, "new": mb, "change": change,
                         "relative": relative, "ci_low": lo, "ci_high": hi, "p_value": p, "n_base": int(a.size),
                         "n_new": int(b.size), "significant": bool(np.isfinite(p) and p < alpha
                                                                   and size > 100 * min_change)})
        if in_a.sum() < 2 or in_b.sum() < 2:
            notes.append(f"{k}: a single launch in one run, so its noise is unknown and nothing about it is flagged; "
                         "profile more launches.")
    frame = pd.DataFrame(rows, columns=["kernel", "quantity", "unit", "base", "new", "change", "relative", "ci_low",
                                        "ci_high", "p_value", "n_base", "n_new", "significant"])
    frame = frame.set_index(["kernel", "quantity"]).fillna({"unit": ""})
    missing = sorted((set(qa) | set(qb)) - set(common))
    if missing:
        notes.append(f"only one run has {', '.join(missing)}: not compared.")
    flagged = int(frame["significant"].sum())
    notes.insert(0, f"{flagged} of {len(frame)} differences are larger than run-to-run noise (Welch t-test, "
                    f"p < {alpha:g}, and a change over {100 * min_change:g}%: of the base for times, metrics and "
                    "rates, points for Top-Down nodes and speed-of-light percentages); base, new, change and ci (the "
                    "confidence interval of new - base) in each row's unit.")
    title = (f"gpuscope compare: {_count(len(kernels), 'kernel')}; base {_count(base.sizes['range'], 'range')} "
             f"({base.attrs.get('created', '?')}), new {_count(new.sizes['range'], 'range')} "
             f"({new.attrs.get('created', '?')})")
    out = _new(frame, title, notes, {"relative": "%"}, _PRIORITY)
    return Comparison(out).__finalize__(out)


#: What ``gpuscope compare --fail-on`` can fail on (:meth:`Comparison.flagged`).
FAIL_ON = ("slower", "change")

#: The columns a narrow terminal keeps, most important first.
_PRIORITY = ("base", "new", "unit", "relative", "significant", "p_value", "ci_low", "ci_high", "n_base", "n_new",
             "change")


class Comparison(Report):
    """The result of :func:`compare`: prints the time rows and the significant ones."""

    @property
    def _constructor(self):
        return Comparison

    def flagged(self, what: str = "change") -> list[tuple[str, str]]:
        """The (kernel, quantity) rows that changed beyond noise: every significant row (*what* ``"change"``) or
        the kernels whose GPU time per launch went up (``"slower"``), as ``gpuscope compare --fail-on`` judges.

        Raises
        ------
        ValueError
            *what* is neither ``"change"`` nor ``"slower"``.
        """
        if what not in FAIL_ON:
            raise ValueError(f"what must be one of {', '.join(map(repr, FAIL_ON))}, not {what!r}")
        frame = pd.DataFrame(self)
        hit = frame["significant"].to_numpy(bool)
        if what == "slower":
            quantities = frame.index.get_level_values("quantity")
            hit = hit & (quantities == "gpu_time_us") & (frame["change"].to_numpy(float) > 0)
        return [tuple(map(str, k)) for k in frame.index[hit]]

    def to_text(self, width: int | None = None, all_rows: bool = False) -> str:
        """The table as text no wider than *width* (see :meth:`Report.to_text`): time rows and significant rows,
        or every row with *all_rows*."""
        frame = pd.DataFrame(self)
        quantities = frame.index.get_level_values("quantity")
        keep = frame["significant"].to_numpy() | (quantities == "gpu_time_us") | quantities.str.startswith("only in")
        keep = keep | all_rows
        shown = Report(frame[keep])
        shown.attrs = dict(self.attrs)
        if not keep.all():
            shown.attrs["notes"] = [*self.notes, f"{int((~keep).sum())} rows within noise not shown "
                                                 "(the DataFrame has them all)."]
        return Report.to_text(shown, width)
