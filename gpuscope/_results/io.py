"""Saving and exporting gpuscope Datasets: netCDF save/load, Perfetto/Chrome-trace export."""

from __future__ import annotations

import errno
import json
import math
import os
import secrets

import numpy as np

from gpuscope._schema import dataset as _dataset
from gpuscope._util import validate as _validate

def _dataset_arg(ds, what: str) -> None:
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        hint = " (load a file first with gpuscope.open_dataset)" if isinstance(ds, (str, os.PathLike)) else ""
        raise ValueError(f"{what} an xarray.Dataset as ds{hint}; got {type(ds).__name__}")


def _path_arg(path, what: str) -> None:
    if path is None:
        raise ValueError(f"{what} (path=, a str or pathlib.Path); got None")
    _validate.path(path, "path")


# ---------------------------------------------------------------------------------------------------------
# Perfetto / Chrome trace (JSON "Trace Event Format"): one trace of a run from range, PM and phases Datasets
# ---------------------------------------------------------------------------------------------------------

#: Top-Down level-1 nodes put in the args of a kernel or range slice when its Dataset allows Top-Down.
_TRACE_TOPDOWN = ("retire", "divergence", "frontend", "backend")
#: The metric whose value is a launch slice's duration when the range results have it (the kernel's GPU time).
_GPU_TIME = "gpu__time_duration.sum"


class _Trace:
    """Events on CUPTI timestamps (``ts`` in ns until :meth:`finish` makes it µs from an origin), one process
    per device, one thread track per kind of slice and Dataset."""

    def __init__(self):
        self.events = []  # timed events in the order they were added (per track: in time order)
        self.tids = {}  # (pid, track name) -> tid
        self.pids = {}
        self.hot_spots = {}  # kernel -> its hottest source lines (PC sampling), put in its slices' args
        self.hot_spots_used = set()

    def hot_args(self, kernel: str) -> dict:
        """``pc.hot_lines`` for a slice of *kernel* when PC samples of it were given."""
        if not self.hot_spots:
            return {}
        from gpuscope._schema.names import match_kernel

        hit = match_kernel(kernel, self.hot_spots)
        if hit is None:
            return {}
        self.hot_spots_used.add(hit)
        return {"pc.hot_lines": self.hot_spots[hit]}

    def process(self, ds) -> int:
        pid = int(ds.attrs.get("device_index", 0))
        if pid not in self.pids:
            name = ds.attrs.get("device_name", ds.attrs.get("chip", "GPU"))
            self.pids[pid] = f"gpuscope: {name} (device {pid})"
        return pid

    def track(self, pid: int, name: str) -> int:
        """A thread track of its own: a second track of the same name gets a number ("kernels 2")."""
        base, k = name, 1
        while (pid, name) in self.tids:
            k += 1
            name = f"{base} {k}"
        tid = self.tids[(pid, name)] = len([p for p, _ in self.tids if p == pid]) + 1
        return tid

    def finish(self, origin_ns: int | None, kinds: list[str]) -> dict:
        if origin_ns is None:
            origin_ns = min((e["ts"] for e in self.events), default=0)
        for e in self.events:
            e["ts"] = (e["ts"] - origin_ns) / 1e3
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}
                for pid, label in self.pids.items()]
        for (pid, name), tid in self.tids.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return {"traceEvents": meta + self.events, "displayTimeUnit": "ns",
                "otherData": {"gpuscope": kinds[0] if len(kinds) == 1 else kinds, "origin_ns": int(origin_ns)}}


def _number(value):
    """A JSON-safe number: NaN and infinities (not JSON) become None."""
    value = float(value)
    return value if math.isfinite(value) else None


def _pm_events(trace: _Trace, ds, names: list[str]) -> None:
    """Counter tracks of *names* and the user ranges of a PM sampling Dataset."""
    pid = trace.process(ds)
    t0 = int(ds.attrs["session_start_ns"])
    # a sample's value holds from its start; the first sample's start may reach back before the session
    starts = np.maximum(ds["start_ns"].values.astype(np.int64), t0).tolist()
    events = trace.events
    for name in names:
        unit = ds[name].attrs.get("units", "")
        label = f"{name} ({unit})" if unit else name
        values = np.asarray(ds[name].values, dtype=float)
        values = np.where(np.isfinite(values), values, None).tolist()  # NaN is not JSON: no value
        for ns, value in zip(starts, values):
            events.append({"name": label, "ph": "C", "pid": pid, "tid": 0, "ts": ns, "args": {"value": value}})
    table = _dataset.spans(ds)
    tids = {thread: trace.track(pid, f"ranges (thread {thread})") for thread in sorted(set(table["thread"].tolist()))}
    for p, thread, s, e in zip(table["path"].tolist(), table["thread"].tolist(), table["start_ns"].tolist(),
                               table["end_ns"].tolist()):
        events.append({"name": p.rsplit("/", 1)[-1], "ph": "X", "pid": pid, "tid": tids[thread], "ts": s,
                       "dur": (e - s) / 1e3, "args": {"path": p}})
    if "exec_start_ns" in ds.attrs:
        _execution_events(trace, ds, pid)


def _execution_events(trace: _Trace, ds, pid: int) -> None:
    """One slice per kernel execution on the GPU (``gpuscope.sample(kernels=True)``), a track per stream."""
    table = _dataset.kernel_executions(ds)
    tids = {stream: trace.track(pid, f"GPU kernels (stream {stream})") for stream in sorted(set(table["stream"]))}
    hot = {k: trace.hot_args(k) for k in set(table["kernel"])}
    for kernel, symbol, s, e, stream, corr in zip(table["kernel"].tolist(), table["symbol"].tolist(),
                                                 table["start_ns"].tolist(), table["end_ns"].tolist(),
                                                 table["stream"].tolist(), table["correlation"].tolist()):
        trace.events.append({"name": kernel, "ph": "X", "pid": pid, "tid": tids[stream], "ts": s,
                             "dur": (e - s) / 1e3, "args": {"symbol": symbol, "correlation": corr, **hot[kernel]}})


def _pc_hot_spots(pc, top: int = 3) -> dict:
    """Per kernel of a PC sampling Dataset: its *top* source lines by samples, each with its commonest state."""
    from gpuscope.metrics.pc_plot import line_stalls

    out = {}
    for kernel in pc["kernel"].values.astype(str).tolist():
        lines = line_stalls(pc, kernel)  # (source_line, stall_reason), coords file, line, line_text
        per_line = lines.sum("stall_reason").values
        total = int(per_line.sum())
        out[kernel] = []
        for i in np.argsort(-per_line, kind="stable")[:top]:
            share = round(100 * int(per_line[i]) / total, 1) if total else 0.0
            state = str(lines["stall_reason"].values[int(np.argmax(lines.values[i]))])
            where = f"{str(lines['file'].values[i]).rsplit('/', 1)[-1]}:{int(lines['line'].values[i])}"
            out[kernel].append(f"{where} {share}% {state}: {str(lines['line_text'].values[i]).strip()}"[:160])
    return out


def _range_topdown(ds):
    """Top-Down level 1 per range, or None when the Dataset's metrics do not allow it."""
    import warnings

    from gpuscope.errors import GpuscopeWarning, MissingMetricsError
    from gpuscope.metrics import topdown

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GpuscopeWarning)  # coverage is the Top-Down page's business
            td = topdown.topdown(ds, levels=(1,), check="ignore")
    except (MissingMetricsError, ValueError):
        return None
    return {node: td[node].values.tolist() for node in _TRACE_TOPDOWN if node in td}


def _range_events(trace: _Trace, ds) -> None:
    """One slice per kernel launch (track "kernels") or user range (track "ranges") of a range Dataset."""
    pid = trace.process(ds)
    n = ds.sizes["range"]
    start, end = ds["start_ns"].values.astype(np.int64), ds["end_ns"].values.astype(np.int64)
    kernel = ds["kernel"].values.astype(str).tolist() if "kernel" in ds.coords else [""] * n
    name = ds["name"].values.astype(str).tolist()
    metrics = [m for m in _dataset._as_list(ds.attrs.get("metrics", [])) if m in ds.data_vars]
    values = {m: ds[m].values.tolist() for m in metrics}
    td = _range_topdown(ds) or {}
    extra = [c for c in ("launch", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "pass_group")
             if c in ds.coords]
    coords = {c: ds[c].values.tolist() for c in extra}
    gpu_ns = (np.asarray(ds[_GPU_TIME].values, dtype=float) if _GPU_TIME in ds.data_vars
              else np.full(n, np.nan))
    tids = {}
    for i in range(n):
        if start[i] < 0 or end[i] < start[i]:  # no timestamps (a range profiled without the launch clock)
            continue
        track = "kernels" if kernel[i] else "ranges"
        if track not in tids:
            tids[track] = trace.track(pid, track)
        args = {"path": name[i], **{c: coords[c][i] for c in extra}}
        args.update({m: _number(values[m][i]) for m in metrics})
        args.update({f"topdown.{node}": _number(v[i]) for node, v in td.items()})
        dur = int(end[i] - start[i]) / 1e3
        if kernel[i]:
            args.update(trace.hot_args(kernel[i]))
            # The launch-to-end span holds every kernel-replay pass (37.6 ms for a 79.7 us kernel on the H100):
            # draw the kernel's own GPU time from its launch, and keep the span in the args.
            args["profiled_span_us"] = dur
            if np.isfinite(gpu_ns[i]) and gpu_ns[i] > 0:
                dur, args["duration_from"] = float(gpu_ns[i]) / 1e3, f"{_GPU_TIME}, drawn from the launch"
            else:
                args["duration_from"] = "launch to the end of its profiling (replay passes included)"
        trace.events.append({"name": kernel[i] or name[i].rsplit("/", 1)[-1], "ph": "X", "pid": pid,
                             "tid": tids[track], "ts": int(start[i]), "dur": dur, "args": args})


def _phase_events(trace: _Trace, ph) -> None:
    """One slice per segment of a :func:`gpuscope.phases` result, named by its phase."""
    dim = ph.attrs.get("phases_dim", "time")
    if "start_ns" not in ph.coords or ph["start_ns"].dims != (dim,):
        raise ValueError("this phases Dataset has no CUPTI timestamps (coords start_ns/end_ns along its samples), so "
                         "it cannot be placed on the trace's clock; run gpuscope.phases on a dataset from "
                         "gpuscope.sample or a Profiler")
    pid = trace.process(ph)
    tid = trace.track(pid, "phases")
    metrics = ph["metric"].values.astype(str).tolist()
    means = ph["segment_mean"].values
    fraction = ph["phase_fraction"].values
    for k, (p, s, e) in enumerate(zip(ph["segment_phase"].values.tolist(), ph["segment_start"].values.tolist(),
                                      ph["segment_end"].values.tolist())):
        args = {"phase": int(p), "segment": k, "phase_fraction": _number(fraction[p])}
        args.update({m: _number(v) for m, v in zip(metrics, means[k])})
        if "phase_topdown" in ph:
            args.update({f"topdown.{node}": _number(v) for node, v in
                         zip(ph["node"].values.astype(str).tolist(), ph["phase_topdown"].values[p])
                         if node in _TRACE_TOPDOWN})
        trace.events.append({"name": f"phase {p}", "ph": "X", "pid": pid, "tid": tid, "ts": int(round(s)),
                             "dur": (e - s) / 1e3, "args": args})


def _trace_kind(ds, position: str) -> str:
    _dataset_arg(ds, f"to_perfetto needs {position} to be")
    if "phases_dim" in ds.attrs and "segment_phase" in ds:
        return "phases"
    kind = ds.attrs.get("kind")
    if kind == "pm_sampling" and "time" in ds.dims:
        return "pm_sampling"
    if kind == "range" and "range" in ds.dims:
        return "range"
    if kind == "pc_sampling" and "samples" in ds:
        return "pc_sampling"
    from gpuscope.errors import NotGpuscopeDataError

    raise NotGpuscopeDataError(
        f"{position} is not a Dataset to_perfetto can place on a timeline (kind={kind!r}); pass range results "
        "(gpuscope.Profiler, kind 'range'), PM samples (gpuscope.sample, kind 'pm_sampling'), the result of "
        "gpuscope.phases or PC samples (gpuscope.pc_sample, kind 'pc_sampling'), e.g. as loaded with "
        "gpuscope.open_dataset")


def _write(trace: dict, path) -> None:
    if path is not None:
        with open(path, "w") as f:
            json.dump(trace, f)


def to_perfetto(path: str | os.PathLike | None, *datasets) -> dict:
    """Write one Perfetto / Chrome trace of a run from any mix of range, PM sampling and phases Datasets.

    Every Dataset is placed on the CUPTI clock (``start_ns``/``end_ns`` of ranges and samples, the PM session's
    ``session_start_ns``), so tracks from different sessions of one process line up; times are µs from the
    earliest event. Each device is one process in the trace, with these tracks:

    * range results (kind ``range``, kernel / iteration / user mode): a ``kernels`` track with one slice per
      launch, named by kernel, and a ``ranges`` track with one slice per user range (nested by path). A slice's
      args hold its path, launch index, grid and block, every metric of the set, and ``topdown.retire`` ...
      ``topdown.backend`` (Top-Down level 1, IPC units) when the set allows Top-Down. A launch slice lasts the
      kernel's GPU time (``gpu__time_duration.sum``) from the launch when the set has it; otherwise it spans
      the launch to the end of its profiling, kernel-replay passes included. ``args["duration_from"]`` says
      which, ``args["profiled_span_us"]`` holds the span.
    * PM samples (kind ``pm_sampling``): one counter track per metric (``name (units)``) and the user ranges
      recorded during sampling, one track per host thread, as :func:`to_chrome_trace` gives them.
    * PM samples recorded with ``kernels=True``: a ``GPU kernels (stream N)`` track per stream with one slice
      per kernel execution, from its start to its end on the GPU (:func:`gpuscope.kernel_executions`).
    * PC samples (kind ``pc_sampling``, :func:`gpuscope.pc_sample`): no track of their own (they have no
      times); every slice of a kernel they sampled gets ``pc.hot_lines`` in its args, the kernel's three
      hottest source lines (``file:line share% state: text``), and ``otherData["pc_hot_spots"]`` holds them
      for every kernel (``pc_hot_spots_unmatched``: kernels no slice was found for).
    * phases (the result of :func:`gpuscope.phases`): a ``phases`` track with one slice per segment, named
      ``phase <id>`` (recurring phases share the name), its metric means and, when computed, the phase's
      Top-Down level 1 in args. Its samples' counters are added too unless the PM Dataset they came from is
      also passed.

    Open the file at https://ui.perfetto.dev (or chrome://tracing). Nothing runs on a GPU; the cost is one JSON
    event per sample and metric (about 120 bytes each: 18,000 samples x 8 metrics make ~17 MB).

    Parameters
    ----------
    path : str, PathLike or None
        Where to write the JSON; None writes nothing (the trace is still returned).
    *datasets : xarray.Dataset
        One or more Datasets of the run, in any order.

    Returns
    -------
    dict
        The trace (``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``);
        ``otherData["origin_ns"]`` is the CUPTI timestamp of ts 0.

    Raises
    ------
    ValueError
        No dataset given, an argument is not a Dataset (a path included: load it with
        :func:`gpuscope.open_dataset`), a phases Dataset without CUPTI timestamps, or only PC samples.
    gpuscope.errors.NotGpuscopeDataError
        A Dataset that is neither range results, PM samples nor phases.
    TypeError
        *path* is not a str, PathLike or None.

    Examples
    --------
    >>> launches = gpuscope.open_dataset("launches.nc")            # doctest: +SKIP
    >>> ts = gpuscope.open_dataset("series.nc")                    # doctest: +SKIP
    >>> gpuscope.to_perfetto("run.json", launches, ts, gpuscope.phases(ts))   # doctest: +SKIP
    """
    if path is not None:
        _validate.path(path, "path")
    if not datasets:
        raise ValueError("to_perfetto needs at least one Dataset after the path: range results, PM samples "
                         "or phases, e.g. gpuscope.to_perfetto('run.json', launches, ts, gpuscope.phases(ts))")
    kinds = [_trace_kind(ds, f"dataset {i + 1}") for i, ds in enumerate(datasets)]
    if all(k == "pc_sampling" for k in kinds):
        raise ValueError("PC samples have no times of their own: pass them with the range results or PM samples "
                         "(kernels=True) whose kernel slices they annotate")
    pm_sessions = {int(ds.attrs["session_start_ns"]) for ds, k in zip(datasets, kinds) if k == "pm_sampling"}
    trace = _Trace()
    for ds, kind in zip(datasets, kinds):
        if kind == "pc_sampling":
            trace.hot_spots.update(_pc_hot_spots(ds))
    for ds, kind in zip(datasets, kinds):
        if kind == "range":
            _range_events(trace, ds)
        elif kind == "pm_sampling":
            _pm_events(trace, ds, _dataset._as_list(ds.attrs["metrics"]))
        elif kind == "phases":
            if ds.attrs.get("kind") == "pm_sampling" and int(ds.attrs["session_start_ns"]) not in pm_sessions:
                _pm_events(trace, ds, [m for m in _dataset._as_list(ds.attrs["metrics"]) if m in ds.data_vars])
            _phase_events(trace, ds)
    out = trace.finish(None, [k for k in kinds if k != "pc_sampling"])
    if trace.hot_spots:
        out["otherData"]["pc_hot_spots"] = trace.hot_spots
        out["otherData"]["pc_hot_spots_unmatched"] = sorted(set(trace.hot_spots) - trace.hot_spots_used)
    _write(out, path)
    return out


def to_chrome_trace(ds, path: str | os.PathLike | None = None, metrics=None) -> dict:
    """Export a PM sampling Dataset as a Chrome/Perfetto trace: one counter track per metric, user ranges as
    slices on their threads. Times are µs from the session start.

    Open the file at https://ui.perfetto.dev or chrome://tracing. For a trace of a whole run (kernel launches,
    PM counters and phases together) see :func:`to_perfetto`.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset from ``gpuscope.sample`` (``attrs["kind"] == "pm_sampling"``), e.g. loaded from netCDF.
    path : str or PathLike, optional
        Where to write the JSON. Without it nothing is written.
    metrics : list of str, optional
        The metrics to export (default: all).

    Returns
    -------
    dict
        The trace (``{"traceEvents": [...], ...}``).

    Raises
    ------
    ValueError
        *ds* is not a PM sampling dataset (None included), a metric is not in it, or *metrics* is empty.
    TypeError
        *path* is not a str or PathLike; *metrics* is not a name or a list of names.
    """
    _dataset_arg(ds, "to_chrome_trace exports")
    if path is not None:
        _validate.path(path, "path")
    if metrics is not None:
        metrics = _validate.names(metrics, "metrics")
    if ds.attrs.get("kind") != "pm_sampling" or "time" not in ds.dims:
        raise ValueError("to_chrome_trace exports PM sampling datasets (from gpuscope.sample); this one is not.")
    known = _dataset._as_list(ds.attrs["metrics"])  # a file read without gpuscope has one metric as a str
    names = ([metrics] if isinstance(metrics, str) else list(metrics)) if metrics is not None else known
    missing = [m for m in names if m not in ds.data_vars]
    if missing:
        raise ValueError(f"Not in this dataset: {missing}. It has: {known}.")
    trace = _Trace()
    _pm_events(trace, ds, names)
    out = trace.finish(int(ds.attrs["session_start_ns"]), ["pm_sampling"])
    _write(out, path)
    return out


# ---------------------------------------------------------------------------------------------------------
# netCDF (HDF5 through h5netcdf): lossless round trip of every gpuscope Dataset
# ---------------------------------------------------------------------------------------------------------


#: Dataset attr in which :func:`save_dataset` records the attrs netCDF cannot store as they are.
ATTR_TYPES = "gpuscope_attr_types"


def _encode_attr(value):
    """(netCDF-safe value, type tag or None when stored as it is)."""
    if value is None:
        return "", "none"
    if isinstance(value, (bool, np.bool_)):
        return int(value), "bool"
    if isinstance(value, dict):
        return json.dumps(value), "json"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not items:
            return "", "list"
        if all(isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items, dtype=np.int8), "bool_list"
        if all(isinstance(v, str) for v in items):
            return items, "list"
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items), "list"
        raise ValueError(f"a list attr must hold only str, only numbers or only bools, got {items[:5]!r}; "
                         "convert it (e.g. to a JSON string) before saving")
    if isinstance(value, (str, int, float, np.integer, np.floating)):
        return value, None
    raise ValueError(f"netCDF cannot store an attr of type {type(value).__name__} ({value!r}); use str, numbers, "
                     "bool, None, lists of those, or a dict (saved as JSON)")


#: Variable attr of a string variable that :func:`save_dataset` stored as integer codes: the JSON list of its
#: distinct strings, which the codes index.
STRING_TABLE = "gpuscope_strings"


def _encode_strings(ds):
    """*ds* with each object-dtype string variable that is not an index (the per-sample ``range`` of PM samples) as
    int32 codes into a table of its distinct strings: netCDF would store every sample's string in full, and xarray
    read them back as a ``<U`` array of 4 bytes per character of the longest (GBs for long range names)."""
    import pandas as pd

    for name, var in list(ds.variables.items()):
        if var.dtype != object or name in ds.indexes:
            continue
        try:
            codes, names = pd.factorize(var.values.ravel())
        except TypeError:  # unhashable values: not strings, left for netCDF to refuse or store
            continue
        if (codes < 0).any() or not all(isinstance(v, str) for v in names):
            continue  # not only strings: left as it is
        coded = var.copy(data=codes.astype(np.int32).reshape(var.shape))
        coded.attrs[STRING_TABLE] = json.dumps(list(names))
        coded.encoding = {}  # a string encoding read from a file does not fit the codes
        ds = ds.assign_coords({name: coded}) if name in ds.coords else ds.assign({name: coded})
    return ds


def _decode_strings(ds):
    """Undo :func:`_encode_strings`: each coded variable as an object array holding one str per distinct value."""
    for name, var in list(ds.variables.items()):
        if STRING_TABLE in var.attrs:
            table = np.array(json.loads(var.attrs[STRING_TABLE]), dtype=object)
            var = var.copy(data=table[var.values])
            del var.attrs[STRING_TABLE]
            ds = ds.assign_coords({name: var}) if name in ds.coords else ds.assign({name: var})
    return ds


#: The type tags :func:`_encode_attr` writes.
_TAGS = ("none", "bool", "json", "list", "bool_list")


def _attr_types(ds, path) -> dict:
    """The ``{owner: {attr: tag}}`` table of a file, taken out of its attrs; a clear error if it is not one."""
    from gpuscope.errors import NotGpuscopeDataError

    text = ds.attrs.pop(ATTR_TYPES, "{}")
    try:
        tags = json.loads(text)
    except (TypeError, ValueError):
        tags = None
    if not (isinstance(tags, dict) and all(
            isinstance(attrs, dict) and all(isinstance(tag, str) and tag in _TAGS for tag in attrs.values())
            for attrs in tags.values())):
        raise NotGpuscopeDataError(
            f"{os.fspath(path)}: its {ATTR_TYPES} attribute ({str(text)[:80]!r}) is not what gpuscope writes (a JSON "
            f"object {{variable or \"\": {{attr: type}}}} with types {', '.join(_TAGS)}): the file was edited or "
            f"damaged. Save the Dataset again with gpuscope.save_dataset, or delete that attribute to read it as "
            "plain netCDF.")
    return tags


def _decode_attr(value, tag: str):
    if tag == "none":
        return None
    if tag == "bool":
        return bool(value)
    if tag == "json":
        return json.loads(value)
    items = _dataset._as_list(value)
    return [bool(v) for v in items] if tag == "bool_list" else items


def save_dataset(ds, path: str | os.PathLike) -> None:
    """Write a gpuscope Dataset to a netCDF-4 file (HDF5, through h5netcdf), losslessly.

    :func:`open_dataset` reads it back identical, indexes and attrs included. Attrs that netCDF cannot store
    as they are (bool, None, lists, which come back as a scalar when they have one element, dicts) are encoded,
    and the Dataset attr ``gpuscope_attr_types`` (a JSON dict ``{variable or "": {attr: type}}``) records how
    to decode them; other readers see ``0``/``1`` for bools, ``""`` for None and ``[]``, and JSON text for
    dicts. String variables of dtype object (the per-sample ``range`` of PM samples) are stored as integer codes
    with their distinct strings in the attr ``gpuscope_strings`` (JSON), so a long range name is stored once.

    Parameters
    ----------
    ds : xarray.Dataset
        Any Dataset; gpuscope's own are the usual case.
    path : str or PathLike
        File to write. An existing file is replaced only once the new one is complete: the Dataset is written to a
        temporary file in the same folder, which is then renamed to *path*, so a save that fails (or is
        interrupted) leaves the file that was there as it was, and no temporary file.

    Raises
    ------
    ValueError
        *ds* is not a Dataset (None included), *path* is None, or an attribute holds a value that cannot be stored
        (an object, a list of mixed types); the message names it.
    TypeError
        *path* is not a str or PathLike.
    """
    _dataset_arg(ds, "save_dataset writes")
    _path_arg(path, "save_dataset needs a path to write to")
    out = _encode_strings(ds.copy(deep=False))
    tags = {}
    for owner, attrs in [("", out.attrs)] + [(str(k), out[k].attrs) for k in out.variables]:
        encoded = {}
        for key, value in attrs.items():
            if key == ATTR_TYPES and owner == "":
                continue
            try:
                encoded[key], tag = _encode_attr(value)
            except ValueError as err:
                raise ValueError(f"attr {key!r} of {owner or 'the Dataset'}: {err}") from None
            if tag:
                tags.setdefault(owner, {})[key] = tag
        if owner == "":
            out.attrs = encoded
        else:
            out[owner].attrs = encoded
    if tags:
        out.attrs[ATTR_TYPES] = json.dumps(tags, sort_keys=True)
    _replace_with(path, lambda tmp: out.to_netcdf(tmp, engine="h5netcdf"))


def _replace_with(path, write) -> None:
    """Call ``write(tmp)`` on a new file beside *path*, then rename it to *path* (``os.replace``, atomic on one
    file system): a write that fails or is interrupted (Ctrl-C included) leaves the file that was at *path* as it
    was, and no temporary file. A symlink at *path* keeps pointing at the file, which is replaced."""
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, "it is a folder: give a file name in it", os.fspath(path))
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    try:  # O_EXCL: never someone else's file; mode 0o666 less the umask, as a plain open gives (tempfile's is 0o600)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:  # the folder is missing or not writable: say so of the path asked for
        raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_dataset(path: str | os.PathLike):
    """Load a Dataset saved with :func:`save_dataset` (or ``ds.to_netcdf``), fully into memory.

    Attrs come back with the types they were saved with (see :func:`save_dataset`); the indexes of the
    schema (``name`` and ``kernel`` of range results) are restored; files of an older gpuscope layout (grid and
    block along an ``xyz`` dim, user ranges along a ``span`` dim: gpuscope 0.1) are converted to the current
    one, exactly, and metric units an older gpuscope wrote (``byte/second/second``) are corrected
    (:func:`gpuscope._schema.dataset.upgrade`). So ``xr.testing.assert_identical`` holds between a saved and the loaded
    Dataset.

    Parameters
    ----------
    path : str or PathLike
        A netCDF-4 file.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    FileNotFoundError
        No file at *path*.
    gpuscope.errors.NotGpuscopeDataError
        The file's ``gpuscope_attr_types`` record is malformed (not the JSON table :func:`save_dataset` writes),
        or an attr cannot be decoded as it says.
    ValueError
        *path* is None.
    TypeError
        *path* is not a str or PathLike (an integer would be read as an open file descriptor).
    """
    import xarray as xr

    _path_arg(path, "open_dataset needs a path")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No such file: {os.fspath(path)!r} (no gpuscope dataset there).")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{os.fspath(path)!r} is a folder, not a gpuscope dataset: give a .nc file in it.")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    tags = _attr_types(ds, path)
    for owner, attrs in [("", ds.attrs)] + [(str(k), ds[k].attrs) for k in ds.variables]:
        for key, value in list(attrs.items()):
            tag = tags.get(owner, {}).get(key)
            if tag:
                try:
                    attrs[key] = _decode_attr(value, tag)
                except ValueError as exc:
                    from gpuscope.errors import NotGpuscopeDataError

                    raise NotGpuscopeDataError(
                        f"{os.fspath(path)}: attr {key!r} of {owner or 'the Dataset'} cannot be read as {tag} "
                        f"({exc}): the file was edited or damaged. Save the Dataset again with "
                        "gpuscope.save_dataset.") from None
            elif isinstance(value, np.ndarray):
                attrs[key] = value.tolist()
    if "metrics" in ds.attrs:  # files from before gpuscope_attr_types: one metric came back as a str
        ds.attrs["metrics"] = _dataset._as_list(ds.attrs["metrics"])
    return _dataset.upgrade(_decode_strings(ds))
