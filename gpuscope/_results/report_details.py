"""The details page of range results: per kernel, the sections of Nsight Compute's ``--page details`` that the
Dataset's metrics allow (``gpuscope show --page details``, ``gpuscope.report(ds, page="details")``).

Sections, each the analysis of :mod:`gpuscope.metrics` on the kernel's launches combined
(:func:`gpuscope.metrics.combine.combine`):

``launch``
    launches, GPU time, grid and block.
``speed of light``
    :func:`gpuscope.metrics.roofline.roofline`: FLOP/s of each precision that did work against its peak, bandwidth
    of each level against its peak, the arithmetic intensity of the dominant precision, its bound and how much of
    the attainable FLOP/s it reached (the ``roofline`` set).
``memory workload``
    :func:`gpuscope.metrics.memory_workload.memory_workload`: bandwidth, busy share and hit rate per level, the
    busiest unit, shared-memory bank conflicts (the ``memory`` set).
``occupancy``
    achieved occupancy, warps and SM activity (the ``occupancy`` set); the theoretical occupancy, its limiter and
    the waves of :func:`gpuscope.metrics.occupancy.occupancy`, from the registers per thread and shared memory
    that kernel, iteration and auto modes record for each launch (``registers_per_thread``,
    ``shared_memory_static``, ``shared_memory_dynamic``), or from ``registers=`` (and ``shared_memory=``).
``instructions``
    :func:`gpuscope.metrics.instruction_mix.instruction_mix`: instructions executed and issued, threads per
    instruction, each pipe's utilisation, each class's share (the ``instructions`` set).

A section whose metrics the Dataset lacks is left out, and a note names what is missing and the set that collects
it (``full`` collects them all). Values are those of the analyses, in their units (FLOP/s, byte/s, percent);
printed with SI prefixes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results.report_inputs import _device_line, _finite
from gpuscope._results.report_ranges import GPU_TIME, _metric_set, group_key
from gpuscope._results.report_table import _PROSE, Report, _count, _number, _percent, _width, _wrap

__all__ = ["Details", "details"]

#: The sections of the page, in order, and the set that collects each.
SECTIONS = {"launch": "", "speed of light": "roofline", "memory workload": "memory", "occupancy": "occupancy",
            "instructions": "instructions"}
_GROUP = "_group"
_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
#: Units printed with an SI prefix, and how they are printed.
_PREFIXED = {"FLOP/s": "FLOP/s", "byte/s": "B/s", "byte": "B"}
#: Units printed after the value; the others (warps, blocks, instructions) are in the quantity's name.
_PRINTED = {"ms", "us", "FLOP/byte"}


class Details(Report):
    """The details page: a DataFrame indexed by (kernel, section, quantity) with columns ``value`` and ``unit``,
    printed kernel by kernel, section by section."""

    @property
    def _constructor(self):
        return Details

    def to_text(self, width: int | None = None) -> str:
        """The page as text: each kernel's name, then its sections with one quantity per line, then the notes.

        Raises
        ------
        ValueError
            *width* is below 20.
        """
        width = _width(width)
        prose = min(width, _PROSE)
        frame = pd.DataFrame(self)
        lines = _wrap(self.title, prose) if self.title else []
        label = frame.index.names[0]
        quantity_w = max((len(q) for q in frame.index.get_level_values("quantity")), default=0)
        for kernel, rows in frame.groupby(level=0, sort=False):
            lines.append("")
            lines += _wrap(str(kernel), width, "", "    ") if label else []
            for section, part in rows.groupby(level=1, sort=False):
                lines.append(f"  {section}")
                for (_, _, quantity), value, unit in zip(part.index, part["value"], part["unit"]):
                    lines.append(f"    {quantity.ljust(quantity_w)}  {_shown(value, unit)}".rstrip())
        if not len(frame):
            lines.append("(no sections: see the notes)")
        for note in self.notes:
            lines += _wrap(note, prose, "note: ", "      ")
        return "\n".join(lines)


def _shown(value, unit: str) -> str:
    """A value as the page prints it: percentages with their sign, rates and sizes with an SI prefix."""
    if isinstance(value, str):
        return value
    if unit == "%":
        return _percent(value)
    if not np.isfinite(value) or unit not in _PREFIXED and value < 1e6:
        return f"{_number(value)} {unit if unit in _PRINTED else ''}".rstrip()
    scale, prefix = next(((s, p) for s, p in _SI if abs(value) >= s), (1.0, ""))
    return f"{value / scale:.3g} {prefix}{_PREFIXED.get(unit, '')}".rstrip()


def _one(values) -> object:
    """The launches' common value, or "varies" where they differ (a kernel launched with several shapes)."""
    kept = [v for v in values if not (isinstance(v, float) and np.isnan(v))]
    if not kept:
        return np.nan
    return kept[0] if all(v == kept[0] for v in kept) else "varies"


def _launch(ds, key, k: str) -> list[tuple]:
    rows = key == k
    out = [("launches", float(rows.sum()), "")]
    if GPU_TIME in ds:
        t = np.asarray(ds[GPU_TIME].values, dtype=float)[rows]
        out += [("GPU time", float(np.nansum(t)) / 1e6, "ms"), ("mean duration", float(np.nanmean(t)) / 1e3, "us")]
    for what in ("grid", "block"):
        axes = [f"{what}_{a}" for a in "xyz"]
        if all(a in ds.coords for a in axes):
            shapes = [" x ".join(str(int(v)) for v in shape)
                      for shape in zip(*(np.asarray(ds[a].values)[rows] for a in axes))]
            out.append((what, _one(shapes), ""))
    return out


def _roofline(rl, k) -> list[tuple]:
    r = rl.sel({_GROUP: k})
    dominant = str(r["dominant_precision"].values)
    # without the tensor pipes' counters (the roofline-fp set), a GEMM's tensor work is not counted, not absent
    none = ("none (no floating-point work)" if "tensor" in r["precision"].values.astype(str) else
            "none counted (no fp64, fp32 or fp16 work; the tensor pipes were not collected: the roofline set counts "
            "them)")
    out = [("dominant precision", dominant or none, "")]
    for p in r["precision"].values.astype(str):
        if float(r["flop"].sel(precision=p).fillna(0)) > 0:
            rate, peak = float(r["flop_rate"].sel(precision=p)), float(r["peak_flop_rate"].sel(precision=p))
            out += [(f"{p} FLOP/s", rate, "FLOP/s"), (f"{p} peak FLOP/s", peak, "FLOP/s"),
                    (f"{p} of peak", 100 * rate / peak, "%")]
    for level in r["level"].values.astype(str):
        bw, peak = float(r["bandwidth"].sel(level=level)), float(r["peak_bandwidth"].sel(level=level))
        out += [(f"{level} bandwidth", bw, "byte/s"), (f"{level} peak bandwidth", peak, "byte/s"),
                (f"{level} of peak", 100 * bw / peak, "%")]
        if dominant:
            out.append((f"{level} intensity", float(r["intensity"].sel(precision=dominant, level=level)),
                        "FLOP/byte"))
    if dominant:
        out += [("bound", str(r["bound"].sel(precision=dominant).values), ""),
                ("of attainable", 100 * float(r["achieved_fraction"].sel(precision=dominant)), "%")]
    return out


def _memory(mw, k) -> list[tuple]:
    r = mw.sel({_GROUP: k})
    out = []
    for level in r["level"].values.astype(str):
        cell = r.sel(level=level)
        for var, name, unit in (("bandwidth", "bandwidth", "byte/s"), ("busy", "busy", "%"),
                                ("hit_rate", "hit rate", "%")):
            value = float(cell[var])
            if np.isfinite(value):
                out.append((f"{level} {name}", value, unit))
    out += [("busiest unit", str(r["busiest_level"].values), ""), ("busiest share", float(r["busiest_share"]), "%"),
            ("shared bank conflicts", float(r["shared_bank_conflicts"]), "conflict")]
    return out


def _occupancy(combined, launches, key, k) -> list[tuple]:
    from gpuscope.metrics import occupancy as occ

    out = []
    r = combined.sel({_GROUP: k}) if combined is not None else {}
    for name, quantity, unit in ((occ.ACHIEVED, "achieved occupancy", "%"),
                                 (occ.ACHIEVED_WARPS, "achieved warps per SM", "warp")):
        if name in r:
            out.append((quantity, float(r[name]), unit))
    if occ.SM_ACTIVE in r and occ.SM_ELAPSED in r:
        out.append(("SM active", 100 * float(r[occ.SM_ACTIVE]) / float(r[occ.SM_ELAPSED]), "%"))
    if launches is not None:
        rows = np.flatnonzero(key == k)
        for var, quantity, unit in (("theoretical_occupancy", "theoretical occupancy", "%"),
                                    ("theoretical_warps", "theoretical warps per SM", "warp"),
                                    ("blocks_per_sm", "blocks per SM", "block"), ("limited_by", "limited by", ""),
                                    ("registers_allocated", "registers per thread", "register"),
                                    ("registers", "registers in use", "register"),
                                    ("shared_memory_config", "shared memory per SM", "byte"),
                                    ("waves_per_sm", "waves per SM", "wave")):
            values = launches[var].values[rows]
            out.append((quantity, _one([v if isinstance(v, str) else float(v) for v in values.tolist()]), unit))
    return out


def _instructions(im, k) -> list[tuple]:
    r = im.sel({_GROUP: k})
    out = [("executed instructions", float(r["inst_executed"]), "instruction"),
           ("issued instructions", float(r["inst_issued"]), "instruction"),
           ("threads per instruction", float(r["threads_per_inst"]), ""),
           ("busiest pipe", str(r["busiest_pipe"].values), "")]
    ran = r["pipe_utilization"].where(r["pipe_instructions"] > 0).dropna("pipe")
    for pipe in ran.sortby(-ran)["pipe"].values.astype(str):
        out.append((f"{pipe} pipe utilization", float(ran.sel(pipe=pipe)), "%"))
    shares = r["class_share"].where(r["class_share"] > 0).dropna("class")
    for cls in shares.sortby(-shares)["class"].values.astype(str):
        out.append((f"{cls} share", float(shares.sel({"class": cls})), "%"))
    return out


def _missing(section: str, names, what: str = "") -> str:
    """The note for a section (or, *what*, a part of one) that the Dataset's metrics do not give."""
    names = list(names)
    lacks = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"no {what or section + ' section'}: the Dataset lacks {lacks or 'its metrics'}; the "
            f"{SECTIONS[section]!r} set collects them ('full' collects every section).")


def details(ds, *, by: str | None = None, registers=None, shared_memory=None) -> Details:
    """The details page of range results (see the module docstring); :func:`gpuscope.report` with
    ``page="details"`` calls it.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results.
    by : str, optional
        A coordinate to group by (default: the kernel's readable name for launches, the path for user ranges).
    registers, shared_memory : optional
        Registers per thread and shared memory per block, as :func:`gpuscope.occupancy` takes them, over what the
        Dataset records (``registers_per_thread``, ``shared_memory_static``, ``shared_memory_dynamic``: kernel,
        iteration and auto modes record them). With registers from either, the occupancy section adds the
        theoretical occupancy, its limiter and the waves.

    Raises
    ------
    ValueError
        A Dataset whose metrics are all NaN or inf; per-launch *registers* of the wrong length.
    gpuscope.errors.MissingMetricsError
        *registers* is given, but the SM's limits are neither in the Dataset nor known for its chip.
    """
    from gpuscope.errors import MissingMetricsError
    from gpuscope.metrics import instruction_mix, memory_workload, occupancy, roofline
    from gpuscope.metrics.combine import combine

    n = ds.sizes["range"]
    key = np.asarray(ds[by].values).astype(str) if by else group_key(ds)
    launches = "kernel" in ds.coords and bool((np.asarray(ds["kernel"].values).astype(str) != "").any())
    what = "launch" if launches else "range"
    label = by or ("kernel" if launches else "range")
    ds, notes = _finite(ds, "range", what)
    grouped = ds.assign_coords({_GROUP: ("range", key)})
    order = list(dict.fromkeys(key.tolist()))
    if GPU_TIME in ds:
        time = pd.Series(np.asarray(ds[GPU_TIME].values, dtype=float), index=key).groupby(level=0).sum()
        order.sort(key=lambda k: -time.get(k, 0.0))
    analyses = {}
    for section, function in (("speed of light", roofline.roofline), ("memory workload", memory_workload.memory_workload),
                              ("instructions", instruction_mix.instruction_mix)):
        try:
            analyses[section] = function(grouped, by=_GROUP)
        except MissingMetricsError as exc:
            notes.append(_missing(section, exc.missing))
    recorded, _ = occupancy.recorded_resources(ds)
    some_recorded = recorded is not None and bool(np.isfinite(recorded).any())
    per_launch = None
    if registers is not None:
        per_launch = occupancy.occupancy(ds, registers, shared_memory)
    elif some_recorded:
        try:  # registers the session recorded: the SM's limits are recorded with them
            per_launch = occupancy.occupancy(ds, None, shared_memory)
        except MissingMetricsError as exc:
            notes.append(f"no theoretical occupancy: {exc}")
    measured = [v for v in (occupancy.ACHIEVED, occupancy.ACHIEVED_WARPS, occupancy.SM_ACTIVE, occupancy.SM_ELAPSED)
                if v in ds.data_vars]
    # the occupancy set's measured part: achieved occupancy (the other two come with it, or from other sets)
    combined = combine(grouped[[*measured, GPU_TIME]], _GROUP) if occupancy.ACHIEVED in measured and GPU_TIME in ds \
        else None
    if combined is None:
        notes.append(_missing("occupancy", [occupancy.ACHIEVED], "measured occupancy"))
    if registers is None and not some_recorded:
        held = ("none is recorded (registers_per_thread is -1: user ranges, or functions the driver could not be "
                "asked about)" if recorded is not None else
                "the Dataset does not hold them (recorded before gpuscope kept them)")
        notes.append(f"theoretical occupancy, its limiter and the waves need each kernel's registers per thread, and "
                     f"{held}: a session in kernel, iteration or auto mode records them for each launch; otherwise "
                     "gpuscope.report(ds, page='details', registers={kernel: n}) (Numba: "
                     "kernel.get_regs_per_thread(); CuPy: kernel.attributes['num_regs']).")
    elif per_launch is not None and recorded is not None and registers is None and not np.isfinite(recorded).all():
        notes.append("theoretical occupancy only for the launches whose registers per thread the session recorded "
                     "(registers_per_thread is -1 for the others: user ranges, or functions the driver could not be "
                     "asked about); give the others with registers={kernel: n}.")
    rows = []
    for k in order:
        sections = {"launch": _launch(ds, key, k)}
        if "speed of light" in analyses:
            sections["speed of light"] = _roofline(analyses["speed of light"], k)
        if "memory workload" in analyses:
            sections["memory workload"] = _memory(analyses["memory workload"], k)
        if combined is not None or per_launch is not None:
            sections["occupancy"] = _occupancy(combined, per_launch, key, k)
        if "instructions" in analyses:
            sections["instructions"] = _instructions(analyses["instructions"], k)
        rows += [(k, section, q, v, u) for section, items in sections.items() for q, v, u in items]
    frame = pd.DataFrame(rows, columns=[label, "section", "quantity", "value", "unit"])
    frame = frame.set_index([label, "section", "quantity"])
    mode = str(ds.attrs.get("mode", ""))
    title = (f"gpuscope details: {_count(n, what)}, {_count(len(order), label)}, {_metric_set(ds)}"
             + (f", {mode} mode" if mode else "") + f" ({_device_line(ds)})")
    out = Details(frame)
    out.attrs = {"title": title, "notes": notes, "units": {}, "priority": []}
    return out
