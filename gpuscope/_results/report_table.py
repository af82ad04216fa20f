"""The Report: a DataFrame with a title and notes, printed as a table that fits the terminal, its advice in full.

Formatting only: percentages with their sign, numbers to three significant digits, the columns that fit the width
in order of importance, long row labels cut in the middle, prose (title, advice, notes) wrapped; the unit of every
column in ``attrs["units"]`` and in the headers of its CSV files. The builders of :mod:`gpuscope._results.report`
make one with :func:`_new`.
"""

from __future__ import annotations

import functools
import html
import shutil
import textwrap

import numpy as np
import pandas as pd

__all__ = ["Report"]

#: Units that column names end with ("gpu_time_ms", "SM %", "PCIe read GB/s"): such a name states its unit.
_NAMED_UNITS = (("_ms", "ms"), ("_us", "us"), (" %", "%"), (" GB/s", "GB/s"), (" B/s", "B/s"))
_SEP = "  "  # between the columns of a printed table
_MIN_WIDTH = 20  # narrower than this, no table can be laid out
_PROSE = 100  # title, advice and notes wrap here on wider terminals: long lines of prose are hard to read


class Report(pd.DataFrame):
    """A DataFrame with a title and notes, printed as a readable table that fits the terminal.

    Use it as any DataFrame (``report["bound_by"]``); ``print(report)`` gives the fixed-width table
    (:meth:`to_text`) and a notebook shows :meth:`_repr_html_`. :attr:`units` gives each column's unit: shares,
    Top-Down nodes and percent-of-peak metrics are percentages (0-100, printed with a ``%``), as in every Dataset
    and file gpuscope writes; :meth:`to_csv` writes the units into the header (``retire [%]``).
    ``attrs["priority"]`` orders the columns from the most to the least important, for a terminal too narrow for
    all of them.
    """

    @property
    def _constructor(self):
        return Report

    @property
    def title(self) -> str:
        return self.attrs.get("title", "")

    @property
    def notes(self) -> list[str]:
        return list(self.attrs.get("notes", []))

    @property
    def units(self) -> dict:
        """Column -> unit (``"%"``, ``"ms"``, ``"us"``, ``"GB/s"``, ...) of every column that has one."""
        return dict(self.attrs.get("units", {}))

    def with_units(self) -> pd.DataFrame:
        """The table as a plain DataFrame whose column names state their units: ``retire [%]``; a name that
        already ends with its unit (``gpu_time_ms``, ``SM %``) stays as it is."""
        return pd.DataFrame(self).rename(columns={c: f"{c} [{u}]" for c, u in self.units.items()
                                                  if not str(c).endswith(u)})

    def to_csv(self, path_or_buf=None, **kwargs):
        """:meth:`pandas.DataFrame.to_csv` of :meth:`with_units`: every header says its column's unit."""
        return self.with_units().to_csv(path_or_buf, **kwargs)

    def _formatters(self) -> dict:
        units = self.units
        out = {}
        for col in self.columns:
            if units.get(col) == "%":
                out[col] = _percent
            elif pd.api.types.is_float_dtype(self[col].dtype):
                largest = float(np.nanmax(np.abs(self[col].to_numpy(float)), initial=0.0))
                out[col] = functools.partial(_number, noise=largest * NOISE)
        return out

    def to_text(self, width: int | None = None) -> str:
        """The report as text no wider than *width*: title, table, advice, notes.

        Parameters
        ----------
        width : int, optional
            Characters per line (at least 20). Default: the terminal's width (``COLUMNS`` when set, else the
            terminal's, else 80), as :func:`shutil.get_terminal_size` finds it.

        Returns
        -------
        str
            The title, advice and notes wrapped to *width* (at most 100); the table with the columns that fit, the
            least important left out first and named in a note (the DataFrame keeps them all: ``to_csv``,
            ``gpuscope show --csv``); row labels too long for the table shortened with ``...``; the ``advice``
            column in full under the table, once per verdict.

        Raises
        ------
        ValueError
            *width* is below 20.
        """
        width = _width(width)
        frame = pd.DataFrame(self)
        prose = min(width, _PROSE)
        lines = _wrap(self.title, prose) if self.title else []
        notes = self.notes
        if len(frame):
            table, hidden, shortened = _layout(frame, self._formatters(), self.attrs.get("priority", ()), width)
            lines += table
            if hidden:
                notes.append(f"not shown at {width} characters: {', '.join(map(str, hidden))}; every column is in "
                             "the DataFrame (--csv FILE on the command line writes them all; a wider terminal shows "
                             "more).")
            if shortened:
                notes.append("row labels shortened with '...' in the middle to fit; --csv FILE has them in full.")
            lines += _advice(frame, prose)
        else:
            lines.append("(no rows)")
        for note in notes:
            lines += _wrap(note, prose, "note: ", "      ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        body = pd.DataFrame(self).to_html(formatters=self._formatters(), na_rep="-", escape=True)
        head = f"<p><b>{html.escape(self.title)}</b></p>" if self.title else ""
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return head + body + (f"<ul>{notes}</ul>" if notes else "")


def _width(width: int | None) -> int:
    if width is None:
        return max(_MIN_WIDTH, shutil.get_terminal_size().columns)
    if not isinstance(width, (int, np.integer)) or width < _MIN_WIDTH:
        raise ValueError(f"width must be a whole number of characters, at least {_MIN_WIDTH}; got {width!r}")
    return int(width)


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [""]


#: A value this much smaller than the largest of its column is float rounding (a difference of equal numbers,
#: 3.62e-14 beside 45.4): it prints as 0.
NOISE = 1e-12


def _number(v, noise: float = 0.0) -> str:
    """3 significant digits, thousands separated; 0 for values within *noise* of 0."""
    if pd.isna(v):
        return "-"
    a = abs(v)
    if a <= noise:
        return "0"
    if a == 0 or 0.01 <= a < 1e6:
        return f"{v:,.3g}" if a < 100 else f"{v:,.0f}"
    return f"{v:.3g}"


def _percent(v) -> str:
    """A percentage with its sign; a positive one too small for one decimal is "<0.1%", never "0.0%"."""
    if pd.isna(v):
        return "-"
    return "<0.1%" if 0 < v < 0.05 else f"{v:.1f}%"


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


def _shorten(label: str, width: int) -> str:
    """*label* within *width*, its middle cut out: names that share a prefix (a module, a template) still differ
    at their ends."""
    if len(label) <= width:
        return label
    if width <= 3:
        return label[:width]
    head = (width - 3 + 1) // 2
    return label[:head] + "..." + label[len(label) - (width - 3 - head):]


def _layout(frame: pd.DataFrame, formatters: dict, priority, width: int) -> tuple[list[str], list, bool]:
    """The table's lines within *width*, the columns left out to fit, and whether row labels were shortened.

    Columns are taken in order of importance (*priority*, then the frame's order) until one does not fit: a less
    important column never takes the place of a more important one that is left out. The row labels get at least
    half the width (or what they need), and whatever the chosen columns leave over.
    """
    levels = [[_text(v) for v in frame.index.get_level_values(i)] for i in range(frame.index.nlevels)]
    for i in range(len(levels) - 1):  # a MultiIndex prints each outer label once, as pandas does
        levels[i] = [v if r == 0 or any(levels[j][r] != levels[j][r - 1] for j in range(i + 1)) else ""
                     for r, v in enumerate(levels[i])]
    names = [_text(n) for n in frame.index.names]
    natural = [max([len(n), *map(len, lab)]) for n, lab in zip(names, levels)]
    share = (width - len(_SEP) * (len(levels) - 1)) // len(levels)
    label_w = [min(w, max(len(n), width // 2 // len(levels), 4), share) for n, w in zip(names, natural)]
    for i, labels in enumerate(levels):  # two labels never shortened alike (kernels that differ in their middle)
        distinct = {v for v in labels if v}
        while label_w[i] < natural[i] and len({_shorten(v, label_w[i]) for v in distinct}) < len(distinct):
            label_w[i] += 1
    cells = {c: [formatters.get(c, _text)(v) for v in frame[c].tolist()] for c in frame.columns if c != "advice"}
    col_w = {c: max(len(str(c)), *map(len, v)) for c, v in cells.items()}
    used = sum(label_w) + len(_SEP) * (len(levels) - 1)
    chosen = set()
    for c in [c for c in priority if c in cells] + [c for c in cells if c not in priority]:
        if used + len(_SEP) + col_w[c] > width:
            break
        chosen.add(c)
        used += len(_SEP) + col_w[c]
    for i, w in enumerate(natural):  # what the columns leave over goes to the row labels
        grow = min(width - used, w - label_w[i])
        label_w[i] += grow
        used += grow
    shown = [c for c in cells if c in chosen]
    right = {c: pd.api.types.is_numeric_dtype(frame[c].dtype) or c in formatters for c in shown}

    def line(labels, values) -> str:
        parts = [_shorten(v, w).ljust(w) for v, w in zip(labels, label_w)]
        parts += [v.rjust(col_w[c]) if right[c] else v.ljust(col_w[c]) for c, v in zip(shown, values)]
        return _SEP.join(parts).rstrip()

    out = [line(names, [str(c) for c in shown])]
    out += [line([lab[r] for lab in levels], [cells[c][r] for c in shown]) for r in range(len(frame))]
    hidden = [c for c in frame.columns if c not in chosen and c != "advice"]
    return out, hidden, any(n > w for n, w in zip(natural, label_w))


def _advice(frame: pd.DataFrame, width: int) -> list[str]:
    """The advice column in full, wrapped, once per verdict with the rows it is for."""
    if "advice" not in frame:
        return []
    verdicts = frame["bound_by"] if "bound_by" in frame else pd.Series("", index=frame.index)
    numbered = pd.api.types.is_integer_dtype(frame.index.dtype)  # "phase 1", not a bare "1"
    rows: dict = {}
    for label, bound, advice in zip(frame.index, verdicts, frame["advice"]):
        if advice:
            rows.setdefault((bound, advice), []).append(f"{frame.index.name} {label}" if numbered else str(label))
    out = ["advice:"] if rows else []
    for (bound, advice), labels in rows.items():
        which = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        out += _wrap(f"{bound} ({which}): {advice}", width, "  ", "    ")
    return out


def _new(frame: pd.DataFrame, title: str, notes, units=None, priority=()) -> Report:
    """A Report of *frame*. *units*: column -> unit for the columns whose names do not end with theirs (the others,
    ``gpu_time_ms`` or ``SM %``, are found from their names)."""
    named = {c: u for c in frame.columns for suffix, u in _NAMED_UNITS if str(c).endswith(suffix)}
    out = Report(frame)
    out.attrs = {"title": title, "notes": list(notes),
                 "units": {**named, **{c: u for c, u in (units or {}).items() if c in frame.columns}},
                 "priority": [c for c in priority if c in frame.columns]}
    return out


def _percent_columns(*columns) -> dict:
    """``{column: "%"}`` for :func:`_new`."""
    return dict.fromkeys(columns, "%")


def _plural(noun: str) -> str:
    if "_" in noun:  # a coordinate's name (grid_x), not an English noun: "2 grid_x values", not "2 grid_xes"
        return f"{noun} values"
    return noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def _count(n: int, noun: str) -> str:
    """``1 kernel``, ``2 kernels``, ``3 launches``."""
    return f"{n} {noun if n == 1 else _plural(noun)}"
