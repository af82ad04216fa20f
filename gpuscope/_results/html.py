"""The HTML report: one self-contained file per Dataset or comparison (``gpuscope show --html``, ``gpuscope compare
--html``, ``gpuscope run --html``, ``gpuscope.report(ds, html=...)``).

The page holds everything it needs, Plotly's JavaScript and DataTables' (through itables) inlined, so it opens
from disk or as a CI artifact with no server and no network. Its tables are the report's own (sortable, filterable,
each header with its unit); its figures are drawn from the same numbers (:mod:`gpuscope._results.html_figures`);
the content of each kind of page, and the entry points, are :mod:`gpuscope._results.html_pages`. Plotly and itables are the ``html`` extra.
"""

from __future__ import annotations

import html as _html

import numpy as np
import pandas as pd

from gpuscope._results.report_table import _shorten
from gpuscope.errors import GpuscopeError

__all__ = ["HTML_EXTRA", "HtmlExtraMissing", "Page", "write_html"]

#: What installs the libraries the page is drawn with.
HTML_EXTRA = "pip install 'gpuscope[html]'"

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.35em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1em; } .notes { color: #444; font-size: 0.9em; } .verdict { background: #f4f6fa; padding: 0.6em; }
code, .code { font-family: ui-monospace, monospace; white-space: pre; }
#kernel-picker { position: sticky; top: 0; background: #fff; padding: 0.5em 0; z-index: 10;
                 border-bottom: 1px solid #ddd; }
select { font-size: 1em; max-width: 90%; }
table.dataTable td:first-child { min-width: 14em; max-width: 28em; overflow-wrap: anywhere; }
"""

#: Shows the chosen kernel's sections and hides the others (Plotly figures are resized once visible).
_PICKER_JS = """
function gpuscopeShow(key) {
  document.querySelectorAll("[data-kernel]").forEach(function (el) {
    el.hidden = el.dataset.kernel !== key;
    if (!el.hidden && window.Plotly) {
      el.querySelectorAll(".js-plotly-plot").forEach(function (p) { Plotly.Plots.resize(p); });
    }
  });
}
document.addEventListener("DOMContentLoaded", function () {
  var picker = document.getElementById("kernel");
  if (picker) {
    picker.addEventListener("change", function () { gpuscopeShow(picker.value); });
    gpuscopeShow(picker.value);
  }
});
"""


class HtmlExtraMissing(GpuscopeError, ImportError):
    """The HTML report's libraries (Plotly, itables: the ``html`` extra) are not installed."""


def libraries():
    """Raise :class:`HtmlExtraMissing`, naming the extra, unless plotly and itables import."""
    try:
        import itables  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as exc:
        raise HtmlExtraMissing(f"The HTML report needs Plotly and itables ({exc.name} is not installed): {HTML_EXTRA}. "
                          "The terminal report and --csv need neither.") from None


def esc(text) -> str:
    """*text* as HTML text (markup in kernel names and notes shown, never obeyed)."""
    return _html.escape(str(text))


def rounded(value, percent: bool):
    """A report's number as its terminal table prints it, kept a number so that the table sorts numerically:
    percentages to 0.1 (a small positive one to 1 significant digit, the terminal's "<0.1%"), other numbers to 3
    significant digits (whole from 100 up); None for NaN or inf (shown as '-')."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return value
    v = float(value)
    if not np.isfinite(v):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if percent:
        return round(v, 1) if v == 0 or abs(v) >= 0.05 else float(f"{v:.1g}")
    if 100 <= abs(v) < 1e6:
        return int(round(v))
    return float(f"{v:.3g}") if v else 0.0


def table_frame(report) -> pd.DataFrame:
    """A Report as the page's table: its index as columns, numbers rounded as the terminal prints them, every
    header with its unit (``share [%]``, as the CSV file's), a missing value as ``-``, row labels within
    :data:`LABEL_WIDTH` characters; the advice, prose, is left to :func:`advice`."""
    units = report.units
    frame = pd.DataFrame(report).drop(columns=["advice"], errors="ignore")
    for col in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[col].dtype) and not pd.api.types.is_bool_dtype(frame[col].dtype):
            frame[col] = pd.Series([rounded(v, units.get(col) == "%") for v in frame[col].tolist()],
                                   index=frame.index, dtype=object)
    named = report.__class__(frame)
    named.attrs = dict(report.attrs)
    out = named.with_units().reset_index()
    label = out.columns[0]  # a C++ template kernel's name runs to hundreds of characters: its middle cut out, as
    # the terminal does, where the labels stay apart (the kernel sections below and --csv have them whole)
    short = [_shorten(str(v), LABEL_WIDTH) for v in out[label]]
    if len(set(short)) == len(set(map(str, out[label]))):
        out[label] = short
    for col in out.columns:  # a missing value as '-' (DataTables sorts the column as numbers still), not 'None'
        if out[col].dtype == object:
            out[col] = [("-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else v) for v in out[col]]
    return out


#: The longest row label a page's table shows (PyTorch's kernel names run to 400 characters)
LABEL_WIDTH = 60


def advice(report) -> str:
    """The report's advice once per verdict, with the rows it is for (as the terminal prints it under the
    table), as an HTML list; "" when it has none."""
    if "advice" not in report:
        return ""
    rows: dict = {}
    for label, bound, text in zip(report.index, report["bound_by"], report["advice"]):
        if text:
            rows.setdefault((bound, text), []).append(str(label))
    items = "".join(f"<li><b>{esc(bound)}</b> ({esc(', '.join(labels))}): {esc(text)}</li>"
                    for (bound, text), labels in rows.items())
    return f"<p>Advice:</p><ul class='advice'>{items}</ul>" if items else ""


class Page:
    """An HTML page being written: sections of text, tables and figures, then :meth:`html` for the whole file."""

    def __init__(self, title: str):
        libraries()
        self.title = title
        self.parts: list[str] = []
        self._tables = 0

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def heading(self, text: str, level: int = 2) -> None:
        self.add(f"<h{level}>{esc(text)}</h{level}>")

    def notes(self, notes) -> None:
        if notes:
            self.add("<ul class='notes'>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")

    def table(self, frame: pd.DataFrame, name: str, page_length: int = 25) -> None:
        """*frame* as a sortable, filterable table (DataTables), with the id ``table-<name>``."""
        from itables import to_html_datatable

        self._tables += 1
        long = len(frame) > page_length
        layout = {"topStart": "pageLength" if long else None, "topEnd": "search",
                  "bottomStart": "info" if long else None, "bottomEnd": "paging" if long else None}
        self.add(to_html_datatable(frame, table_id=f"table-{name}", connected=False, showIndex=False,
                                   display_logo_when_loading=False, layout=layout, pageLength=page_length,
                                   classes="display compact", allow_html=False, maxBytes=0, column_filters=False,
                                   warn_on_undocumented_option=False, text_in_header_can_be_selected=False))

    def figure(self, fig) -> None:
        if fig is None:
            return
        self.add(fig.to_html(full_html=False, include_plotlyjs=False,
                             config={"responsive": True, "displaylogo": False}))

    def picker(self, keys: dict[str, str], label: str = "kernel") -> None:
        """The select that switches the sections marked with :meth:`section` ``(key)``; *keys*: key -> label."""
        options = "".join(f"<option value='{esc(k)}'>{esc(v)}</option>" for k, v in keys.items())
        self.add(f"<div id='kernel-picker'><label for='kernel'>{esc(label)}: </label>"
                 f"<select id='kernel'>{options}</select></div>")

    def section(self, key: str) -> None:
        self.add(f"<div data-kernel='{esc(key)}'>")

    def end_section(self) -> None:
        self.add("</div>")

    def html(self) -> str:
        from itables.javascript import generate_init_offline_itables_html
        from itables.options import dt_bundle
        from plotly.offline import get_plotlyjs

        datatables = generate_init_offline_itables_html(dt_bundle) if self._tables else ""
        return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                f"<title>{esc(self.title)}</title><style>{_CSS}</style>"
                f"<script>{get_plotlyjs()}</script><script>{_PICKER_JS}</script>{datatables}</head>"
                f"<body><h1>{esc(self.title)}</h1>\n" + "\n".join(self.parts) + "\n</body></html>\n")


def write_html(text: str, path, overwrite: bool = True) -> str:
    """Write a page to *path* as every output of gpuscope is written (:func:`gpuscope._util.outputs.write`: complete
    or not there, no link followed, nothing but a regular file replaced, an existing one only with *overwrite*),
    and return the absolute path."""
    from gpuscope._util import outputs

    return outputs.write_bytes(path, text.encode("utf-8"), overwrite=overwrite,
                               hint="pass -f/--force to replace it, or give --html another name")
