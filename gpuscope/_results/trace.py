"""Perfetto / Chrome-trace export: one JSON trace of a run from range, PM sampling, phases and PC Datasets.

Events are placed on the CUPTI clock (``start_ns``/``end_ns`` of ranges and samples, the PM session's
``session_start_ns``); the Trace Event Format is documented at https://ui.perfetto.dev and in docs/trace.md.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from gpuscope._results.io import _dataset_arg
from gpuscope._results.sol_quantities import per_launch
from gpuscope._schema import dataset as _dataset
from gpuscope._util import outputs as _outputs
from gpuscope._util import validate as _validate

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
    if _dataset.has_executions(ds):
        _execution_events(trace, ds, pid)


def _execution_events(trace: _Trace, ds, pid: int) -> None:
    """One slice per kernel execution on the GPU (``gpuscope.sample(kernels=True)``), a track per stream."""
    table = _dataset.kernel_executions(ds)
    tids = {stream: trace.track(pid, f"GPU kernels (stream {stream})") for stream in sorted(set(table["stream"]))}
    hot = {k: trace.hot_args(k) for k in set(table["kernel"])}
    for kernel, symbol, s, e, stream, corr, graph, node in zip(
            table["kernel"].tolist(), table["symbol"].tolist(), table["start_ns"].tolist(), table["end_ns"].tolist(),
            table["stream"].tolist(), table["correlation"].tolist(), table["graph_id"].tolist(),
            table["graph_node_id"].tolist()):
        ids = {"graph_id": graph, "graph_node_id": node} if graph > 0 else {}  # a CUDA graph's kernel node
        trace.events.append({"name": kernel, "ph": "X", "pid": pid, "tid": tids[stream], "ts": s,
                             "dur": (e - s) / 1e3, "args": {"symbol": symbol, "correlation": corr, **ids,
                                                            **hot[kernel]}})


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
    sol = per_launch(ds)[0]  # roofline, memory workload and instructions, where the set has them
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
        args.update({name: _number(v[i]) for name, v in sol.items()})
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


def write_trace(trace: dict, path, *, overwrite: bool = True) -> None:
    """Write *trace* as JSON at *path* (:func:`gpuscope._util.outputs.write`: no link followed, nothing but a regular
    file replaced, complete or not at all; a file that exists only with *overwrite*); None writes nothing."""
    if path is None:
        return

    def fill(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(trace, f)

    _outputs.write(path, fill, overwrite=overwrite)


def to_perfetto(*datasets, path: str | os.PathLike | None = None) -> dict:
    """Write one Perfetto / Chrome trace of a run from any mix of range, PM sampling and phases Datasets.

    Every Dataset is placed on the CUPTI clock (``start_ns``/``end_ns`` of ranges and samples, the PM session's
    ``session_start_ns``), so tracks from different sessions of one process line up; times are µs from the
    earliest event. Each device is one process in the trace, with these tracks:

    * range results (kind ``range``, kernel / iteration / user mode): a ``kernels`` track with one slice per
      launch, named by kernel, and a ``ranges`` track with one slice per user range (nested by path). A slice's
      args hold its path, launch index, grid and block, every metric of the set, and ``topdown.retire`` ...
      ``topdown.backend`` (Top-Down level 1, percent of peak) when the set allows Top-Down, and the speed-of-light
      quantities the set allows (``roofline.flop_rate.fp32``, ``memory.hit_rate.L2``,
      ``instructions.pipe_utilization.fma``, ...: :mod:`gpuscope._results.sol_quantities`). A launch slice lasts the
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
    *datasets : xarray.Dataset
        One or more Datasets of the run, in any order. The older form, the path first
        (``to_perfetto("run.json", launches, ts)``), still works: a first argument that is not a Dataset is the path.
    path : str, PathLike or None
        Where to write the JSON; None writes nothing (the trace is still returned).

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
        *path* is not a str, PathLike or None, or a path is given both first and as ``path=``.

    Examples
    --------
    >>> launches = gpuscope.open_dataset("launches.nc")            # doctest: +SKIP
    >>> ts = gpuscope.open_dataset("series.nc")                    # doctest: +SKIP
    >>> gpuscope.to_perfetto(launches, ts, gpuscope.phases(ts), path="run.json")   # doctest: +SKIP
    """
    import xarray as xr

    if datasets and not isinstance(datasets[0], xr.Dataset):  # the older form: the path first
        if path is not None:
            raise TypeError(f"to_perfetto got a path twice: {datasets[0]!r} first and path={path!r}; pass the "
                            "Datasets and path= (to_perfetto(launches, ts, path='run.json'))")
        path, datasets = datasets[0], datasets[1:]
    if path is not None:
        _validate.path(path, "path")
    if not datasets:
        raise ValueError("to_perfetto needs at least one Dataset: range results, PM samples or phases, e.g. "
                         "gpuscope.to_perfetto(launches, ts, gpuscope.phases(ts), path='run.json')")
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
    write_trace(out, path)
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
    write_trace(out, path)
    return out
