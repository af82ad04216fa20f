"""The figures of the HTML report, drawn with Plotly from the numbers the terminal report prints.

Each function takes what :mod:`gpuscope._results.report` already computed (a kernel's Top-Down node values, the
rows of its details page, the phases and spans of a PM series, a kernel's source lines) and returns a
``plotly.graph_objects.Figure``; nothing here computes a quantity again. :mod:`gpuscope._results.html` lays them out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["hierarchy", "instructions", "memory", "occupancy", "roofline", "source_lines", "timeline",
           "topdown_bars", "changes"]

#: The height of a figure with a few bars (px); taller figures grow with their rows.
_HEIGHT = 320
#: Phases shaded in the timeline, at most: past this many stretches the colours only hide the series.
MAX_SHADED = 400


def _go():
    import plotly.graph_objects as go

    return go


def _css(rgba) -> str:
    r, g, b, a = (float(c) for c in rgba)
    return f"rgba({round(255 * r)},{round(255 * g)},{round(255 * b)},{a:g})"


def _words(name: str) -> str:
    """A Top-Down node or PC category in a reader's words, as the matplotlib figures' legends say it."""
    from gpuscope.metrics.pc_plot import ISSUED_WORDS
    from gpuscope.metrics.plot_colors import node_words

    return ISSUED_WORDS if name == "issued" else node_words(name)


def _node_colors(names) -> dict[str, str]:
    from gpuscope.metrics.plot_colors import _node_colors as colors

    return {n: _css(c) for n, c in colors(list(names)).items()}


def _layout(fig, title: str, height: int = _HEIGHT, **more):
    more = {"margin": {"l": 10, "r": 10, "t": 50, "b": 40}, "legend": {"orientation": "h", "y": -0.2}, **more}
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left"}, height=height, template="plotly_white",
                      **more)
    fig.update_yaxes(automargin=True)
    fig.update_xaxes(automargin=True)
    return fig


def topdown_bars(rows: dict[str, dict[str, float]], nodes: list[str]):
    """Stacked horizontal bars, one per kernel, of *nodes* (a level cut of the hierarchy, percent of peak)."""
    go = _go()
    kernels = list(rows)
    colors = _node_colors(nodes)
    fig = go.Figure()
    for node in nodes:
        fig.add_bar(name=_words(node), orientation="h", y=kernels, x=[rows[k].get(node, np.nan) for k in kernels],
                    marker_color=colors[node], hovertemplate=f"%{{y}}<br>{_words(node)}: %{{x:.1f}}%<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="percent of the SM's peak issue rate [%]", range=[0, 100])
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Top-Down per kernel (level 2)", max(_HEIGHT, 120 + 40 * len(kernels)))


def hierarchy(row: dict[str, float], kernel: str):
    """The Top-Down hierarchy of one kernel as an icicle: level 1 under the whole, level 2 and 3 under their
    parents; each box its node's value (percent of peak), children drawn in their parent's share."""
    from gpuscope.metrics.topdown import NODES

    go = _go()
    present = [n for n in NODES if n.name in row and np.isfinite(row[n.name])]
    has_children = {n.parent for n in present}
    colors = _node_colors([n.name for n in present])
    ids, parents, values, labels, shown, marker = ["all"], [""], [0.0], ["issue slots (100%)"], [100.0], ["#ffffff"]
    for n in present:
        ids.append(n.name)
        parents.append(n.parent or "all")
        values.append(0.0 if n.name in has_children else max(float(row[n.name]), 0.0))  # parents: their children
        labels.append(n.name)
        shown.append(float(row[n.name]))
        marker.append(colors[n.name])
    fig = go.Figure(go.Icicle(ids=ids, parents=parents, values=values, labels=labels, branchvalues="remainder",
                              customdata=shown, texttemplate="%{label}<br>%{customdata:.1f}%",
                              hovertemplate="%{label}: %{customdata:.1f}% of peak<extra></extra>",
                              marker={"colors": marker}, tiling={"orientation": "v"}, sort=False))
    return _layout(fig, f"Top-Down hierarchy: {kernel}", 420, margin={"l": 10, "r": 10, "t": 50, "b": 10})


def _value(part: pd.DataFrame, quantity: str) -> float:
    """A number of one kernel's details rows (indexed by quantity), NaN where absent or not a number."""
    if quantity not in part.index:
        return np.nan
    value = part.loc[quantity, "value"]
    return float(value) if isinstance(value, (int, float, np.number)) else np.nan


def roofline(part: pd.DataFrame, kernel: str):
    """The roofline of one kernel from its speed-of-light rows: the peak FLOP/s of its dominant precision, one
    bandwidth ceiling per level, and the kernel at each level's arithmetic intensity. None without a dominant
    precision (no floating-point work: nothing to place)."""
    go = _go()
    dominant = part["value"].get("dominant precision")
    if not isinstance(dominant, str) or dominant.startswith("none"):
        return None
    rate, peak = _value(part, f"{dominant} FLOP/s"), _value(part, f"{dominant} peak FLOP/s")
    levels = [q[: -len(" intensity")] for q in part.index if q.endswith(" intensity")]
    points = {lv: _value(part, f"{lv} intensity") for lv in levels}
    finite = [x for x in points.values() if np.isfinite(x) and x > 0]
    if not finite or not np.isfinite(peak):
        return None
    lo, hi = min(finite + [1.0]) / 10, max(finite + [1.0]) * 10
    fig = go.Figure()
    for lv in levels:
        bw = _value(part, f"{lv} peak bandwidth")
        knee = peak / bw
        xs = [lo, min(max(knee, lo), hi), hi]
        fig.add_scatter(x=xs, y=[min(bw * x, peak) for x in xs], mode="lines", name=f"{lv} ceiling",
                        hovertemplate=f"{lv}: %{{y:.3s}}FLOP/s at %{{x:.3g}} FLOP/byte<extra></extra>")
        fig.add_scatter(x=[points[lv]], y=[rate], mode="markers", name=f"{kernel} at {lv}", marker={"size": 11},
                        hovertemplate=f"{lv} intensity %{{x:.3g}} FLOP/byte<br>%{{y:.3s}}FLOP/s<extra></extra>")
    fig.update_xaxes(type="log", title_text="arithmetic intensity [FLOP/byte]")
    fig.update_yaxes(type="log", title_text=f"{dominant} [FLOP/s]")
    return _layout(fig, f"Roofline ({dominant}): {kernel}", 400)


def memory(part: pd.DataFrame, kernel: str):
    """The memory chart of one kernel: bandwidth per level of the memory hierarchy, its hit rate and busy share
    beside it."""
    go = _go()
    from plotly.subplots import make_subplots

    levels = [q[: -len(" bandwidth")] for q in part.index if q.endswith(" bandwidth")]
    if not levels:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bandwidth [GB/s]", "hit rate and busy share [%]"))
    fig.add_trace(go.Bar(x=levels, y=[_value(part, f"{lv} bandwidth") / 1e9 for lv in levels], name="bandwidth",
                         hovertemplate="%{x}: %{y:.3g} GB/s<extra></extra>"), 1, 1)
    for what in ("hit rate", "busy"):
        fig.add_trace(go.Bar(x=levels, y=[_value(part, f"{lv} {what}") for lv in levels], name=what,
                             hovertemplate=f"%{{x}} {what}: %{{y:.1f}}%<extra></extra>"), 1, 2)
    fig.update_yaxes(range=[0, 100], row=1, col=2)
    return _layout(fig, f"Memory workload: {kernel}")


def occupancy(part: pd.DataFrame, kernel: str):
    """Achieved and theoretical occupancy of one kernel (percent of the SM's warps)."""
    go = _go()
    bars = {q: _value(part, q) for q in ("achieved occupancy", "theoretical occupancy", "SM active")}
    bars = {q: v for q, v in bars.items() if np.isfinite(v)}
    if not bars:
        return None
    fig = go.Figure(go.Bar(x=list(bars.values()), y=list(bars), orientation="h", text=[f"{v:.1f}%" for v in
                                                                                      bars.values()],
                           hovertemplate="%{y}: %{x:.1f}%<extra></extra>"))
    fig.update_xaxes(range=[0, 100], title_text="[%]")
    return _layout(fig, f"Occupancy: {kernel}", 120 + 45 * len(bars))


def instructions(part: pd.DataFrame, kernel: str):
    """The instruction mix of one kernel: each pipe's utilisation and each instruction class's share."""
    go = _go()
    from plotly.subplots import make_subplots

    pipes = [q for q in part.index if q.endswith(" pipe utilization")]
    classes = [q for q in part.index if q.endswith(" share") and q != "busiest share"]
    if not pipes and not classes:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("pipe utilization [%]", "instruction classes [%]"))
    fig.add_trace(go.Bar(y=[q[: -len(" pipe utilization")] for q in pipes], x=[_value(part, q) for q in pipes],
                         orientation="h", name="pipe utilization",
                         hovertemplate="%{y}: %{x:.1f}%<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(y=[q[: -len(" share")] for q in classes], x=[_value(part, q) for q in classes],
                         orientation="h", name="class share", hovertemplate="%{y}: %{x:.1f}%<extra></extra>"), 1, 2)
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, f"Instruction mix: {kernel}", max(_HEIGHT, 100 + 22 * max(len(pipes), len(classes))),
                   showlegend=False)


def timeline(ds, phase, spans: pd.DataFrame | None, columns: dict[str, str]):
    """The PM series over time (ms since the session began): one panel per unit, the phases (*phase*: a label
    per sample) shaded behind them and the user ranges (*spans*) as bars below; zoom by dragging.

    *columns*: metric -> the label (and unit) the report gives it; rates are drawn in GB/s as the report shows
    them."""
    go = _go()
    from plotly.subplots import make_subplots

    t = np.asarray(ds["time"].values, dtype=np.int64) / 1e6
    groups: dict[str, list[str]] = {}
    for metric in columns:
        groups.setdefault("GB/s" if metric.endswith(".per_second") else "%", []).append(metric)
    rows = list(groups) + (["ranges"] if spans is not None and len(spans) else [])
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[3] * len(groups) + ([1] if "ranges" in rows else []))
    for i, (unit, metrics) in enumerate(groups.items(), start=1):
        for metric in metrics:
            y = np.asarray(ds[metric].values, dtype=float) / (1e9 if unit == "GB/s" else 1.0)
            fig.add_trace(go.Scatter(x=t, y=y, mode="lines", name=columns[metric], line={"width": 1},
                                     hovertemplate=f"{columns[metric]}: %{{y:.3g}}<br>%{{x:.3f}} ms<extra></extra>"),
                          i, 1)
        fig.update_yaxes(title_text=f"[{unit}]", row=i, col=1)
    if phase is not None:
        labels = np.asarray(phase)
        starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
        ends = np.r_[starts[1:], len(labels)] - 1
        palette = ["rgba(27,158,119,0.15)", "rgba(217,95,2,0.15)", "rgba(117,112,179,0.15)",
                   "rgba(231,41,138,0.15)", "rgba(102,166,30,0.15)", "rgba(230,171,2,0.15)"]
        for s, e in list(zip(starts, ends))[:MAX_SHADED]:
            fig.add_vrect(x0=t[s], x1=t[e], fillcolor=palette[int(labels[s]) % len(palette)], line_width=0,
                          layer="below", row="all", col=1)
    if "ranges" in rows:
        start = spans["start"].to_numpy(np.int64) / 1e6  # ns since the session began, as the time coord
        length = (spans["end"].to_numpy(np.int64) - spans["start"].to_numpy(np.int64)) / 1e6
        fig.add_trace(go.Bar(orientation="h", base=start, x=length, y=spans["path"], name="ranges",
                             marker_color="rgba(120,120,120,0.6)", showlegend=False,
                             hovertemplate="%{y}: %{x:.3f} ms<extra></extra>"), len(rows), 1)
    fig.update_xaxes(title_text="time since the session began [ms]", row=len(rows), col=1)
    return _layout(fig, "Timeline (drag to zoom, double-click to reset)", 260 * len(groups) + 160)


def source_lines(table: pd.DataFrame, categories: list[str], kernel: str):
    """One bar per source line of a kernel, stacked by stall category, its code beside it."""
    go = _go()
    labels = [f"{int(n)}: {str(code).strip()[:60]}" for n, code in zip(table["line"], table["code"])]
    colors = _node_colors([c for c in categories if _is_node(c)])
    fig = go.Figure()
    for c in categories:
        fig.add_bar(name=_words(c), orientation="h", y=labels, x=table[c], marker_color=colors.get(c),
                    hovertemplate=f"%{{y}}<br>{_words(c)}: %{{x}} samples<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", tickfont={"family": "monospace"})
    fig.update_xaxes(title_text="PC samples")
    return _layout(fig, f"Stalls per source line: {kernel}", 140 + 24 * len(labels))


def _is_node(name: str) -> bool:
    from gpuscope.metrics.topdown import NODES

    return any(n.name == name for n in NODES)


def changes(frame: pd.DataFrame):
    """GPU time per launch of each kernel in the two runs, with the confidence interval of the change."""
    go = _go()
    rows = frame[frame["quantity"] == "gpu_time_us"]
    rows = rows.assign(**{c: pd.to_numeric(rows[c], errors="coerce") for c in ("base", "new", "ci_low", "ci_high")})
    if not len(rows):
        return None
    fig = go.Figure()
    fig.add_bar(name="base", y=rows["kernel"], x=rows["base"], orientation="h",
                hovertemplate="%{y}: %{x:.3g} us<extra>base</extra>")
    err = np.c_[rows["new"] - (rows["base"] + rows["ci_low"]), rows["base"] + rows["ci_high"] - rows["new"]]
    fig.add_bar(name="new", y=rows["kernel"], x=rows["new"], orientation="h",
                error_x={"type": "data", "symmetric": False, "array": err[:, 1], "arrayminus": err[:, 0]},
                hovertemplate="%{y}: %{x:.3g} us<extra>new</extra>")
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="GPU time per launch [us] (bars: means; whiskers: confidence interval of new)")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "GPU time per launch", 140 + 50 * len(rows))
