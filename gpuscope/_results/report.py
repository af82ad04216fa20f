"""The answer at the end of a run: one table per Dataset, one row per kernel (or user range, or phase).

:func:`report` reads any gpuscope Dataset: range results (dim ``range``: per launch or per user range), PM sampling
(dim ``time``) and PC sampling (dims ``pc``/``kernel``). The result is a :class:`Report`, a pandas DataFrame with a
title and notes that prints as a fixed-width table and renders as HTML in a notebook.

Top-Down columns are percentages of the SM's peak issue rate (100 IPC / IPC_MAX), computed with
:func:`gpuscope.metrics.topdown.topdown` and weighted per kernel with :func:`gpuscope.metrics.topdown.aggregate`.
The verdict ``bound_by`` is the level-2 node (level-1 ``retire`` excluded) that loses the most issue slots; its
``culprit`` is the stall reason (level-3 node) under it that loses the most.

This module picks the table for the Dataset; the tables are built in :mod:`gpuscope._results.report_ranges`,
:mod:`gpuscope._results.report_pm` and :mod:`gpuscope._results.report_pc` (Top-Down columns and advice:
:mod:`gpuscope._results.report_topdown`), laid out by :mod:`gpuscope._results.report_table`; ``gpuscope show --page
raw`` is :mod:`gpuscope._results.report_raw`, ``--page details`` (per kernel: speed of light, memory workload,
occupancy, instructions) :mod:`gpuscope._results.report_details`.
"""

from __future__ import annotations

import pandas as pd

from gpuscope._results.report_details import Details, details
from gpuscope._results.report_inputs import _device_line, _kind, graph_note
from gpuscope._results.report_pc import _pc_report
from gpuscope._results.report_pm import _phase_topdown_report, _pm_report
from gpuscope._results.report_ranges import GPU_TIME, _range_report, group_key
from gpuscope._results.report_raw import raw_text
from gpuscope._results.report_table import Report, _new
from gpuscope._results.report_topdown import topdown_per_launch

__all__ = ["GPU_TIME", "PAGES", "Details", "Report", "group_key", "raw_text", "report", "topdown_per_launch"]

#: The pages :func:`report` gives (``gpuscope show --page``; its ``raw`` page is :func:`raw_text`).
PAGES = ("summary", "details")


def report(ds, page: str = "summary", *, html=None, **options) -> Report:
    """A readable per-kernel (or per-range, per-phase) summary of any gpuscope Dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results (``Profiler.dataset``), a PM sampling series (``Sampler.dataset``, or its
        :func:`gpuscope.phases`), PC samples (``PCSampler.dataset``) or a Top-Down per phase
        (``gpuscope.dynamic(td, phases=ph)``), live or loaded with :func:`gpuscope.open_dataset`.
    page : {"summary", "details"}
        ``"summary"`` (default): one row per kernel, range or phase, as below. ``"details"`` (range results only):
        per kernel, the sections Nsight Compute's ``--page details`` shows, as far as the Dataset's metrics allow:
        launch, speed of light (roofline position: FLOP/s and bandwidths against their peaks, arithmetic
        intensity, bound), memory workload (bandwidth, busy share and hit rate per level), occupancy (achieved;
        theoretical from the registers that kernel, iteration and auto modes record, or ``registers=``) and
        instructions (pipe utilisation, instruction classes); a note names each section the Dataset cannot give
        and the set that collects it. A :class:`Details` indexed by (kernel, section, quantity) with columns
        ``value`` and ``unit``: the values of :func:`gpuscope.roofline`, :func:`gpuscope.memory_workload`,
        :func:`gpuscope.occupancy` and :func:`gpuscope.instruction_mix` with ``by="kernel"``.
    by : str, optional
        Range results: a coordinate to group by (default: ``kernel`` for launches, ``name`` for user ranges).
        PM sampling: ``"range"`` (default when user ranges were open) or ``"phase"`` (default for a
        :func:`gpuscope.phases` result, whose labels it uses; otherwise the phases are found first).
    top : int, optional
        PC sampling: how many stall reasons to show per kernel (default 3).
    html : str or path-like, optional
        Also write the report as one self-contained HTML page there (replacing the file): the tables sortable and
        filterable, the Top-Down per kernel and its hierarchy, the details sections, the PM timeline with phases
        and ranges, or the source lines of PC samples, with the same numbers (docs/report.md, "HTML"). Needs the
        ``html`` extra (Plotly, itables); *page* does not change it.
    registers, shared_memory : optional
        Details page: registers per thread and shared memory per block, as :func:`gpuscope.occupancy` takes them
        (a number, ``{kernel: value}`` or one value per launch), for the theoretical occupancy. Sessions in
        kernel, iteration and auto mode record both for each launch (``registers_per_thread``,
        ``shared_memory_static``, ``shared_memory_dynamic``), so they are needed only for user ranges and files
        recorded before gpuscope kept them; given values win over recorded ones.

    Returns
    -------
    Report
        A pandas DataFrame, one row per kernel / range / phase, sorted by share of time. Range results: launches,
        ``gpu_time_ms`` (total), ``mean_us``, ``share``; with the Top-Down metrics ``retire``, ``divergence``,
        ``frontend``, ``backend`` (percent of peak), ``bound_by``, ``culprit``, ``advice``; throughput metrics
        (``*.pct_of_peak*``) as means. Without ``gpu__time_duration.sum`` the time column is named for what it is
        (``launch_call_ms`` in kernel mode) and a note says so. NaN and inf values are missing data: left out of
        sums and means and counted in a note; a row without a Top-Down says ``bound_by`` "no data" (Top-Down per
        phase: "not attributed") and gets no advice. Shares and Top-Down nodes are percentages (0-100), as in
        every Dataset and file; :attr:`Report.units` names each column's unit and :meth:`Report.to_csv` writes it
        into the header. ``print(report)`` shows a table that fits the terminal (:meth:`Report.to_text`) with its
        notes.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        *ds* is not a gpuscope Dataset.
    ValueError
        An unknown page, option or ``by`` value; the details page of data other than range results; a Dataset of
        several devices (report each
        :func:`gpuscope.select_device`); a Dataset whose metrics are all NaN or inf (nothing to report).

    Examples
    --------
    >>> ds = gpuscope.open_dataset("out.nc")
    >>> print(gpuscope.report(ds))
    >>> gpuscope.report(ds)["bound_by"]
    >>> print(gpuscope.report(ds, page="details"))
    >>> gpuscope.report(ds, html="report.html")  # open it in a browser
    """
    if page not in PAGES:
        raise ValueError(f"page must be one of {', '.join(map(repr, PAGES))}, not {page!r} (every value of every "
                         "row: gpuscope.to_dataframe(ds), or gpuscope show --page raw).")
    kind = _kind(ds)
    if "device" in ds.dims:
        held = ds["device"].values.tolist() if "device" in ds.coords else list(range(ds.sizes["device"]))
        raise ValueError(f"This Dataset holds the samples of devices {held} (dim 'device'); report one at a time: "
                         f"gpuscope.report(gpuscope.select_device(ds, {held[0]})) (gpuscope show does each).")
    builders = {"range": (_range_report, {"by"}), "pm_sampling": (_pm_report, {"by"}),
                "pc_sampling": (_pc_report, {"top"}), "topdown_by_phase": (_phase_topdown_report, set())}
    if page == "details":
        if kind != "range":
            raise ValueError(f"the details page is per kernel launch or user range: range results only, not {kind} "
                             "data (its report is the summary page, the default).")
        builders["range"] = (details, {"by", "registers", "shared_memory"})
    build, allowed = builders[kind]
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"report(page={page!r}) of a {kind} Dataset takes {sorted(allowed)}, not {sorted(unknown)}.")
    if kind == "range" and options.get("by") and options["by"] not in ds.coords:
        raise ValueError(f"by={options['by']!r} is not a coordinate of the Dataset; coordinates: {list(ds.coords)}")
    if html is not None:
        from gpuscope._results.html_pages import report_html

        report_html(ds, html, report=report, **options)
    if kind == "range" and ds.sizes.get("range", 0) == 0:
        graphs = graph_note(ds)
        return _new(pd.DataFrame(index=pd.Index([], name="kernel")),
                    f"gpuscope report: nothing was profiled ({_device_line(ds)})" + (f". {graphs}." if graphs else ""),
                    ["The Dataset has no ranges: no kernel launch or range matched while the session was open."
                     + (" Kernel replay does not see the kernels inside CUDA graphs: a gpuscope.range around each "
                        "graph launch in mode='user' profiles it as one row (docs/range-profiling.md, 'CUDA graphs')."
                        if graphs else "")])
    return build(ds, **options)
