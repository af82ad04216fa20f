"""What each HTML page shows: range results, PM sampling, PC sampling, a comparison (:mod:`gpuscope._results.html`).

Every table is a :func:`gpuscope.report` (or :func:`gpuscope.compare`) result as the terminal prints it, and every
figure is drawn from those tables or from the inputs the report reads (:func:`grouped_topdown` for the Top-Down per
kernel, :func:`gpuscope.phases` for the phases, :func:`gpuscope.source` for the source lines). The report itself is
given by the caller (*report*: :func:`gpuscope._results.report.report`), which imports this module to write a page.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results import html_figures as figures
from gpuscope._results.html import Page, advice, esc, table_frame, write_html

__all__ = ["compare_html", "compare_page", "pc_page", "pm_page", "range_page", "report_html", "table_page"]


def _page(report, heading: str) -> Page:
    page = Page(heading)
    page.add(f"<p>{esc(report.title)}</p>")
    return page


def _keys(labels) -> dict[str, str]:
    """A key for each label (kernel names hold any character; the keys are plain)."""
    return {f"k{i}": str(label) for i, label in enumerate(labels)}


def _details_table(part: pd.DataFrame) -> str:
    """One section of a kernel's details page as a small table, each value as the terminal prints it."""
    from gpuscope._results.report_details import _shown

    rows = "".join(f"<tr><td>{esc(q)}</td><td style='text-align:right'>{esc(_shown(v, u))}</td></tr>"
                   for q, v, u in zip(part.index, part["value"], part["unit"]))
    return f"<table class='details'>{rows}</table>"


_SECTION_FIGURES = {"speed of light": figures.roofline, "memory workload": figures.memory,
                    "occupancy": figures.occupancy, "instructions": figures.instructions}


def range_page(ds, report, *, by: str | None = None, registers=None, shared_memory=None) -> Page:
    """Range results: the per-kernel table with the verdict, the Top-Down per kernel, the verdict of each launch,
    and per kernel (chosen in a list) its Top-Down hierarchy and the sections of the details page."""
    from gpuscope._results.report_inputs import _finite
    from gpuscope._results.report_ranges import group_key
    from gpuscope._results.report_topdown import grouped_topdown, topdown_per_launch
    from gpuscope.metrics.topdown import level_cut

    grouping = {"by": by} if by else {}
    summary = report(ds, **grouping)
    page = _page(summary, "gpuscope report")
    label = summary.index.name or "kernel"
    page.heading(f"Per {label}")
    page.table(table_frame(summary), "summary")
    page.add(advice(summary))
    page.notes(summary.notes)

    rows: dict = {}
    checked, _ = _finite(ds, "range", "launch")  # as the report reads the Dataset: inf is no data
    result = topdown_per_launch(checked)
    if result is not None:
        key = np.asarray(ds[by].values).astype(str) if by else group_key(ds)
        rows, _ = grouped_topdown(result[0], key)
        page.heading("Top-Down")
        page.figure(figures.topdown_bars({k: rows[k] for k in summary.index if k in rows}, level_cut(2)))

    if result is not None and "launch" in ds.coords and ds.sizes["range"] > 1 and by != "launch":
        launches = report(ds, by="launch")
        kernel_of = dict(zip(np.asarray(ds["launch"].values).astype(str), group_key(ds)))
        frame = table_frame(launches)
        frame.insert(1, label, [kernel_of.get(str(v), "") for v in frame.iloc[:, 0]])
        page.heading("Verdict of each launch")
        page.table(frame, "launches")

    details = report(ds, page="details", **grouping,
                     **{k: v for k, v in (("registers", registers), ("shared_memory", shared_memory)) if v is not None})
    frame = pd.DataFrame(details)
    keys = _keys(summary.index)
    page.heading(f"Each {label}")
    page.picker(keys, label)
    for key, name in keys.items():
        page.section(key)
        if name in summary.index and "bound_by" in summary:
            verdict = summary.loc[name]
            page.add(f"<p class='verdict'><b>{esc(name)}</b>: bound by <b>{esc(verdict['bound_by'])}</b>"
                     + (f" ({esc(verdict['culprit'])})" if verdict.get("culprit") else "")
                     + (f". {esc(verdict['advice'])}" if verdict.get("advice") else "") + "</p>")
        if name in rows:
            page.figure(figures.hierarchy(rows[name], name))
        if name in frame.index.get_level_values(0):
            for section, part in frame.loc[name].groupby(level=0, sort=False):
                part = part.droplevel(0)
                page.heading(section, 3)
                draw = _SECTION_FIGURES.get(section)
                page.figure(draw(part, name) if draw else None)
                page.add(_details_table(part))
        page.end_section()
    page.notes(details.notes)
    return page


def pm_page(ds, report, *, by: str | None = None) -> Page:
    """PM sampling: the report per user range and per phase, and the timeline with the phases shaded and the
    ranges below (zoomable)."""
    from gpuscope._results.report_inputs import SHORT_NAMES
    from gpuscope._schema.dataset import spans
    from gpuscope.metrics.phases import phases

    summary = report(ds, **({"by": by} if by else {}))
    page = _page(summary, "gpuscope report: PM sampling")
    page.heading(f"Per {summary.index.name}")
    page.table(table_frame(summary), "summary")
    page.notes(summary.notes)
    labelled = "phase" in ds.data_vars and ds["phase"].dims == ("time",)
    found = ds if labelled else phases(ds)  # what the report per phase reads: the labels it finds or is given
    if summary.index.name != "phase":
        per_phase = report(found, by="phase")
        page.heading("Per phase")
        page.table(table_frame(per_phase), "phases")
        page.notes(per_phase.notes[1:])
    metrics = [v for v in ds.data_vars if ds[v].dims == ("time",) and v != "phase"
               and np.issubdtype(ds[v].dtype, np.number)]
    table = spans(ds) if "span_path" in ds.attrs else None
    page.heading("Timeline")
    page.figure(figures.timeline(ds, found["phase"].values, table, {m: SHORT_NAMES.get(m, m) for m in metrics}))
    return page


def _source_table(table) -> tuple[pd.DataFrame, list[str]]:
    """One kernel's source lines (:func:`gpuscope.source`): line, code, samples and their stall categories, and
    the SASS counts where the table has them."""
    frame = pd.DataFrame({"line": table["line"].values.astype(int), "code": table["line_text"].values.astype(str)})
    categories: list[str] = []
    if "stall_samples" in table:
        frame["samples"] = table["samples"].values
        by_category = table["stall_samples"].groupby("category").sum("stall_reason")
        totals = by_category.sum("source_line")
        categories = [str(c) for c in by_category["category"].values[np.argsort(-totals.values, kind="stable")]
                      if int(totals.sel(category=c)) > 0]
        for c in categories:
            frame[c] = by_category.sel(category=c).values
    for name in ("smsp__sass_inst_executed", "instructions", "threads_per_instruction", "predicated_off"):
        if name in table:
            frame[name] = table[name].values
    return frame, categories


def pc_page(ds, report, *, top: int = 3) -> Page:
    """PC sampling: the per-kernel report, and per kernel its source lines with their stalls beside the code."""
    from gpuscope.metrics.source import source

    summary = report(ds, top=top)
    page = _page(summary, "gpuscope report: PC sampling")
    page.heading("Per kernel")
    page.table(table_frame(summary), "summary")
    page.notes(summary.notes)
    if "line" not in ds.coords:
        return page
    tables = source(pc=ds)
    keys = _keys(tables)
    page.heading("Source lines")
    page.picker(keys)
    for i, (key, name) in enumerate(keys.items()):
        frame, categories = _source_table(tables[name])
        page.section(key)
        page.figure(figures.source_lines(frame, categories, name))
        frame = frame.rename(columns={c: f"{c} [samples]" for c in ["samples", *categories]})
        page.table(frame, f"source-{i}", page_length=50)
        page.end_section()
    page.notes(["Each line's PC samples by the Top-Down category of the warp's state: 'issued' found the warp "
                "issuing, the others stalled (gpuscope.source gives the stall reasons under them)."])
    return page


def table_page(ds, report) -> Page:
    """A Dataset whose report is a table alone (the Top-Down per phase of gpuscope.dynamic)."""

    summary = report(ds)
    page = _page(summary, "gpuscope report")
    page.table(table_frame(summary), "summary")
    page.notes(summary.notes)
    return page


def compare_page(result) -> Page:
    """A comparison: GPU time per launch in both runs, and every row of the comparison (significant ones first)."""
    page = _page(result, "gpuscope compare")
    frame = table_frame(result)
    page.figure(figures.changes(frame))
    page.heading("Every difference")
    page.table(frame.sort_values(["significant", "kernel"], ascending=[False, True], kind="stable"), "compare")
    page.notes(result.notes)
    return page


def report_html(ds, path=None, *, report, overwrite: bool = True, **options) -> str:
    """The HTML page of a gpuscope Dataset (range results, PM sampling, PC sampling), written to *path* when given.

    *report* is :func:`gpuscope.report` (passed in: it imports this module for ``html=``); *options* as it takes
    them (``by``, ``top``, ``registers``, ``shared_memory``).

    Returns
    -------
    str
        The page.

    Raises
    ------
    gpuscope._results.html.HtmlExtraMissing
        Plotly or itables is missing (the ``html`` extra); an ImportError.
    """
    from gpuscope._results.report_inputs import _kind

    build = {"range": range_page, "pm_sampling": pm_page, "pc_sampling": pc_page,
             "topdown_by_phase": table_page}[_kind(ds)]
    text = build(ds, report, **options).html()
    if path is not None:
        write_html(text, path, overwrite)
    return text


def compare_html(result, path=None, overwrite: bool = True) -> str:
    """The comparison page of a :func:`gpuscope.compare` result, written to *path* when given (an existing file
    replaced only with *overwrite*)."""
    text = compare_page(result).html()
    if path is not None:
        write_html(text, path, overwrite)
    return text
