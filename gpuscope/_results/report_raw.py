"""Every value of a Dataset as text, block by block with its unit (``gpuscope show --page raw``)."""

from __future__ import annotations

import textwrap

import numpy as np

from gpuscope._results.report_inputs import _device_line, _kind
from gpuscope._results.report_table import _PROSE, _width, _wrap

__all__ = ["raw_text"]


def raw_text(ds, width: int | None = None) -> str:
    """Every value of every numeric variable of *ds* with its unit, row by row (``gpuscope show --page raw``).

    One block per position along the variables' first dimension (a launch, a sample, a PC), headed by its
    coordinates, then one line per variable: ``name  value  unit`` (a variable with more dimensions gives one line
    per value, its name followed by the other coordinates in brackets). Values are printed as they are, NaN and
    inf included. ``gpuscope.to_dataframe(ds)`` is the same as a table.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        *ds* is not a gpuscope Dataset.
    ValueError
        *width* is below 20.
    """
    width = _width(width)
    _kind(ds)
    sizes = ", ".join(f"{d}: {n}" for d, n in ds.sizes.items())
    lines = _wrap(f"gpuscope raw values ({sizes}; {_device_line(ds)})", min(width, _PROSE))
    groups: dict = {}
    for v in ds.data_vars:
        if np.issubdtype(ds[v].dtype, np.number) or ds[v].dtype == bool:
            groups.setdefault(ds[v].dims[:1], []).append(v)
    for dims, names in groups.items():
        dim = dims[0] if dims else None
        size = ds.sizes[dim] if dim else 1
        heads = _raw_heads(ds, dim, size)
        entries = [entry for v in names for entry in _raw_entries(ds, v)]
        name_w = max(len(e[0]) for e in entries)
        value_w = max(len(t) for e in entries for t in e[1])
        # one aligned line per value where all fit; else each value on a line of its own under its name
        one_line = all(2 + name_w + 2 + value_w + 2 + len(e[2]) <= width for e in entries)
        for i in range(size):
            lines.append("")
            lines += _wrap(heads[i], width, "", "    ")
            for name, texts, unit in entries:
                if one_line:
                    lines.append(f"  {name.ljust(name_w)}  {texts[i].rjust(value_w)}  {unit}".rstrip())
                else:
                    lines += textwrap.wrap(name, width, initial_indent="  ", subsequent_indent="  ")
                    lines += _wrap(f"{texts[i]} {unit}", width, "      ", "      ")
    return "\n".join(lines)


def _raw_heads(ds, dim, size: int) -> list[str]:
    """Each block's heading: the position along *dim* and every coordinate along it."""
    if dim is None:
        return ["(values without a dimension)"]
    own = _coordinate_texts(ds[dim].values) if dim in ds.coords else _coordinate_texts(np.arange(size))
    others = [(c, _coordinate_texts(ds[c].values)) for c in ds.coords if ds[c].dims == (dim,) and c != dim]
    return [f"{dim} {own[i]}" + "".join(f", {c} {values[i]}" for c, values in others) for i in range(size)]


def _coordinate_texts(values) -> list[str]:
    """A coordinate's values as the values below them are written (numbers in one notation, 1,795,337,039 as
    157,616), an empty label as ``(none)``: a top-level range has no parent, a sample outside every range none."""
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.number) or values.dtype == bool:
        return [_raw_value(v) for v in values]
    return [str(v) or "(none)" for v in values]


def _raw_entries(ds, name: str) -> list[tuple[str, list[str], str]]:
    """(label, the value's text at each position along the first dimension, unit) per value of one variable."""
    var = ds[name]
    unit = str(var.attrs.get("units", ""))
    values = np.asarray(var.values)
    if values.ndim <= 1:
        return [(name, [_raw_value(x) for x in values.reshape(-1)], unit)]
    rest = var.dims[1:]
    labels = [np.asarray(ds[d].values).astype(str) if d in ds.coords else np.arange(ds.sizes[d]).astype(str)
              for d in rest]
    return [(f"{name}[{','.join(lab[j] for lab, j in zip(labels, idx))}]",
             [_raw_value(x) for x in values[(slice(None), *idx)]], unit)
            for idx in np.ndindex(*values.shape[1:])]


def _raw_value(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if np.issubdtype(type(x), np.integer):
        return f"{int(x):,}"
    x = float(x)
    # a million and more as whole numbers (1,164,760 beside 157,616, not 1.16476e+06); others to 6 digits
    return f"{x:,.0f}" if np.isfinite(x) and 1e6 <= abs(x) < 1e15 else f"{x:,.6g}"
