"""The source view: one table per kernel joining SASS instruction counts and PC-sampling stalls per source line.

Pure functions over the Datasets of :func:`gpuscope.source_counters` (dim ``pc``, one variable per SASS metric)
and :func:`gpuscope.pc_sample` (dims ``pc``, ``stall_reason``); both carry the pc coords ``function``, ``file``,
``line`` and ``line_text``, and the join is on (kernel, file, line).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["source", "source_line_keys"]

_INST, _THREAD, _PRED_ON = ("smsp__sass_inst_executed", "smsp__sass_thread_inst_executed",
                            "smsp__sass_thread_inst_executed_pred_on")


def source_line_keys(ds: xr.Dataset) -> np.ndarray:
    """``file:line`` of every PC of *ds* (line 0: no line info)."""
    return np.asarray([f"{f}:{int(n)}" for f, n in zip(ds["file"].values, ds["line"].values)], dtype=str)


def _lines(parts: list[xr.Dataset]) -> tuple[list[str], dict[str, tuple[str, int, str]]]:
    """Every source line of the kernel in either Dataset, ordered by file and line, with (file, line, text)."""
    first: dict[str, tuple[str, int, str]] = {}
    for part in parts:
        for key, f, n, text in zip(source_line_keys(part), part["file"].values, part["line"].values,
                                   part["line_text"].values):
            if key not in first or (not first[key][2] and text):
                first[key] = (str(f), int(n), str(text))
    return sorted(first, key=lambda k: first[k][:2]), first


def _per_line(part: xr.Dataset, names: list[str], order: list[str], dims: tuple = ()) -> dict[str, xr.DataArray]:
    """Each variable of *part* in *names* summed over the PCs of each line, aligned to *order* (0 where absent)."""
    keyed = part.assign_coords(source_line=("pc", source_line_keys(part)))
    out = {}
    for name in names:
        summed = keyed[name].groupby("source_line").sum("pc")
        out[name] = summed.reindex(source_line=order, fill_value=0).transpose("source_line", *dims)
    return out


def _of_kernel(ds: xr.Dataset | None, kernel: str) -> xr.Dataset | None:
    """The PCs of *kernel* (dtypes kept: ``where`` would make counts float)."""
    if ds is None:
        return None
    return ds.isel(pc=np.flatnonzero(ds["function"].values == kernel))


def _kernel_table(kernel: str, counters: xr.Dataset | None, pc: xr.Dataset | None) -> xr.Dataset:
    sub_c = _of_kernel(counters, kernel)
    sub_p = _of_kernel(pc, kernel)
    parts = [p for p in (sub_c, sub_p) if p is not None and p.sizes.get("pc", 0)]
    order, first = _lines(parts)
    data: dict[str, xr.DataArray] = {}
    if sub_c is not None:
        metrics = [str(m) for m in counters.attrs.get("metrics", [])] or \
            [n for n in counters.data_vars if counters[n].dims == ("pc",)]
        data.update({n: v.astype(np.int64) for n, v in _per_line(sub_c, metrics, order).items()})
        for n in metrics:
            data[n].attrs = dict(counters[n].attrs)
        ones = xr.ones_like(sub_c["pc_offset"], dtype=np.int64).rename("instructions")
        data["instructions"] = _per_line(sub_c.assign(instructions=ones), ["instructions"], order)["instructions"]
        data["instructions"].attrs = {"units": "instruction", "description": "SASS instructions of the line"}
        if _INST in data and _THREAD in data:
            ratio = data[_THREAD] / data[_INST].where(data[_INST] > 0)
            data["threads_per_instruction"] = ratio.assign_attrs(
                units="thread", description="active threads per warp-level execution (32: no divergence)")
        if _THREAD in data and _PRED_ON in data:
            data["predicated_off"] = (data[_THREAD] - data[_PRED_ON]).assign_attrs(
                units="instruction", description="thread instructions executed with the predicate off")
    if sub_p is not None:
        stalls = _per_line(sub_p, ["samples"], order, dims=("stall_reason",))["samples"].astype(np.int64)
        data["stall_samples"] = stalls.assign_attrs(units="samples", description="PC samples per warp state")
        data["samples"] = stalls.sum("stall_reason").assign_attrs(units="samples", description="PC samples")
    table = xr.Dataset(data).assign_coords(
        source_line=("source_line", np.asarray(order, dtype=str)),
        file=("source_line", np.asarray([first[k][0] for k in order], dtype=str)),
        line=("source_line", np.asarray([first[k][1] for k in order], dtype=np.int64)),
        line_text=("source_line", np.asarray([first[k][2] for k in order], dtype=str)),
    )
    if sub_p is not None:
        table = table.assign_coords(category=pc["category"])
    launches = None
    if counters is not None and "launches" in counters.coords and kernel in counters["kernel"].values:
        launches = int(counters["launches"].sel(kernel=kernel))
    table.attrs = {"kernel": kernel, "launches": -1 if launches is None else launches,
                   "has_counters": int(sub_c is not None and sub_c.sizes.get("pc", 0) > 0),
                   "has_pc_samples": int(sub_p is not None and sub_p.sizes.get("pc", 0) > 0)}
    return table


def source(counters: xr.Dataset | None = None, pc: xr.Dataset | None = None, kernel: str | None = None):
    """One table per kernel: per source line, SASS instruction counts, PC-sampling stalls and the line's text.

    Parameters
    ----------
    counters : xarray.Dataset, optional
        From :func:`gpuscope.source_counters` (``SourceCounters.dataset``).
    pc : xarray.Dataset, optional
        From :func:`gpuscope.pc_sample` (``PCSampler.dataset``). At least one of the two is needed.
    kernel : str, optional
        A kernel's name (as the Datasets' ``kernel`` dim names it): return only its table.

    Returns
    -------
    dict of str to xarray.Dataset, or xarray.Dataset
        Per kernel (or the one *kernel*), a Dataset with dim ``source_line`` (``file:line``, ordered by file and
        line; line 0 holds PCs without line info) and coords ``file``, ``line``, ``line_text``. From *counters*:
        each SASS metric summed over the line's instructions, ``instructions`` (SASS instructions of the line),
        ``threads_per_instruction`` (thread / warp-level executions: 32 without divergence) and
        ``predicated_off`` (thread instructions executed with the predicate off). From *pc*: ``stall_samples``
        (source_line, stall_reason; coord ``category``) and ``samples``. A line only one side has is 0 on the
        other. attrs: ``kernel``, ``launches`` (counted in the counters block, -1 if unknown), ``has_counters``,
        ``has_pc_samples``.

    Raises
    ------
    ValueError
        Neither Dataset given, or *kernel* is in neither.

    Examples
    --------
    >>> tables = gs.source(sc.dataset, pcs.dataset)                        # doctest: +SKIP
    >>> tables["saxpy"][["line_text", "smsp__sass_inst_executed", "samples"]].to_dataframe()  # doctest: +SKIP
    """
    if counters is None and pc is None:
        raise ValueError("gpuscope.source needs a source-counters Dataset, a PC-sampling Dataset, or both")
    kernels: list[str] = []
    for ds in (counters, pc):
        if ds is not None:
            kernels += [str(k) for k in np.unique(ds["function"].values) if str(k) not in kernels]
    if kernel is not None:
        if kernel not in kernels:
            raise ValueError(f"kernel {kernel!r} is in neither Dataset; they hold {sorted(kernels)}")
        return _kernel_table(kernel, counters, pc)
    return {k: _kernel_table(k, counters, pc) for k in sorted(kernels)}
