"""Per-rank Datasets merged into one along a ``rank`` dimension: :func:`open_ranks` and :func:`merge_ranks`.

Merging reads gpuscope Datasets as :mod:`gpuscope._results.build` writes them; which rank wrote each comes from its
attrs (:mod:`gpuscope._results.job`).
"""

from __future__ import annotations

import glob
import os
import warnings

import numpy as np

from gpuscope._results.job import FIELD
from gpuscope._schema.dataset import (
    EXEC_TABLE,
    SAMPLE_SPAN_ATTRS,
    SPAN_INDEX,
    SPAN_TABLE,
    TABLE_ATTRS,
    table_attrs,
    table_columns,
)
from gpuscope.errors import GpuscopeWarning, RankMergeError

__all__ = ["open_ranks", "merge_ranks"]


#: Range coords that follow from the range's path: one value per merged range, not per rank.
_KEY_COORDS = ("name", "depth", "parent", "kernel")
#: Attrs that become per-rank coordinates whether or not they differ (what identifies a rank and its clock).
_RANK_ATTRS = {"host": "", "device_index": -1, "local_rank": -1, "session_start_ns": -1, "wall_clock_ns": -1}
_WALL = "wall clock (time.time_ns), from each rank's session clock link"
_SKIP_ATTRS = {"rank", *TABLE_ATTRS}  # the tables are merged on their own


def _paths(paths_or_glob) -> list[str]:
    if isinstance(paths_or_glob, (str, os.PathLike)):
        text = os.fspath(paths_or_glob)
        pattern = FIELD.sub("*", text)  # "prof-{rank}.nc" -> "prof-*.nc"
        found = sorted(glob.glob(pattern))
        if not found:
            raise RankMergeError(f"no files match {pattern!r}" + (f" (from {text!r})" if pattern != text else "")
                                 + "; give the per-rank files' paths, a glob such as 'prof-*.nc' or the pattern "
                                   "given to rank_path")
        return found
    paths = [os.fspath(p) for p in paths_or_glob]
    if not paths:
        raise RankMergeError("open_ranks got an empty list of files; give the per-rank files' paths or a glob")
    return paths


def open_ranks(paths_or_glob):
    """Open per-rank files (:func:`gpuscope.open_dataset`) and combine them into one Dataset with a ``rank`` dim.

    See :func:`merge_ranks` for the layout, the clock alignment and what is refused.

    Parameters
    ----------
    paths_or_glob : str, PathLike or sequence of them
        The files; a str is a glob (``"out/prof-*.nc"``) or a :func:`rank_path` pattern (``"out/prof-{rank}.nc"``,
        each ``{field}`` matching anything).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    gpuscope.errors.RankMergeError
        No file matches; or see :func:`merge_ranks`.
    FileNotFoundError
        A listed file does not exist.
    """
    from gpuscope._results.io import open_dataset

    paths = _paths(paths_or_glob)
    return merge_ranks([open_dataset(p) for p in paths], sources=paths)


def _rank_of(datasets, sources) -> list[int]:
    has = [("rank" in ds.attrs and int(ds.attrs["rank"]) >= 0) for ds in datasets]
    if not any(has):
        warnings.warn(f"none of the {len(datasets)} Datasets records its rank (files from gpuscope before rank "
                      "detection, or a Dask worker gpuscope did not start): ranks are numbered in the order given",
                      GpuscopeWarning, stacklevel=4)
        return list(range(len(datasets)))
    if not all(has):
        missing = [s for s, h in zip(sources, has) if not h]
        raise RankMergeError(f"some Datasets record their rank and these do not: {missing}; merge files of one "
                             "job, or set ds.attrs['rank'] on each before gpuscope.merge_ranks")
    ranks = [int(ds.attrs["rank"]) for ds in datasets]
    seen: dict[int, list[str]] = {}
    for r, s in zip(ranks, sources):
        seen.setdefault(r, []).append(s)
    dupes = {r: s for r, s in seen.items() if len(s) > 1}
    if dupes:
        text = "; ".join(f"rank {r}: {', '.join(s)}" for r, s in sorted(dupes.items()))
        raise RankMergeError(f"several Datasets of the same rank ({text}). Each rank must write its own file "
                             "(name it with gs.rank_path('prof-{rank}.nc')); remove the stale ones")
    return ranks


def _check_same(datasets, sources) -> str:
    kinds = [ds.attrs.get("kind") for ds in datasets]
    chips = [ds.attrs.get("chip", "") for ds in datasets]
    several = [s for ds, s in zip(datasets, sources) if "device" in ds.dims]
    if several:
        raise RankMergeError(f"{several} hold the samples of several devices (dim 'device', from gpuscope.sample("
                             "device=[...])); merge one device per rank: gpuscope.select_device(ds, device)")
    if any(k not in ("range", "pm_sampling") for k in kinds):
        bad = [f"{s} ({k!r})" for s, k in zip(sources, kinds) if k not in ("range", "pm_sampling")]
        raise RankMergeError(f"only range results (kind 'range') and PM samples (kind 'pm_sampling') merge across "
                             f"ranks; these are not: {bad}")
    if len(set(kinds)) > 1 or len(set(chips)) > 1:
        listing = ", ".join(f"{s}: {k}/{c}" for s, k, c in zip(sources, kinds, chips))
        raise RankMergeError(f"Datasets of different kinds or chips do not merge into one ({listing}); merge range "
                             "results and PM samples separately, and one GPU model at a time")
    return kinds[0]


def _clock_offsets(datasets, sources):
    """Per rank, ns to add to a CUPTI timestamp to get wall-clock ns; None when a rank lacks the clock link."""
    linked = ["wall_clock_ns" in ds.attrs and "session_start_ns" in ds.attrs for ds in datasets]
    if all(linked):
        return [int(ds.attrs["wall_clock_ns"]) - int(ds.attrs["session_start_ns"]) for ds in datasets]
    warnings.warn("timestamps stay on each rank's CUPTI clock (not comparable across hosts): these Datasets have no "
                  f"wall_clock_ns/session_start_ns clock link: {[s for s, k in zip(sources, linked) if not k]}",
                  GpuscopeWarning, stacklevel=4)
    return None


def _fill(dtype, default=None):
    if default is not None:
        return default
    if np.issubdtype(dtype, np.floating):
        return np.nan
    if np.issubdtype(dtype, np.integer):
        return -1
    if dtype == bool:
        return False
    return ""


def _stack(columns, positions, length, dtype, fill):
    """A (rank, length) array: rank i's *columns[i]* placed at *positions[i]*, *fill* elsewhere."""
    if fill is np.nan and not np.issubdtype(dtype, np.floating):
        dtype = np.float64
    if np.issubdtype(dtype, np.str_):
        width = max([1] + [np.asarray(c).dtype.itemsize // 4 for c in columns if np.asarray(c).dtype.kind == "U"])
        dtype = f"<U{width}"
    out = np.full((len(columns), length), fill, dtype=dtype)
    for i, (col, pos) in enumerate(zip(columns, positions)):
        out[i, pos] = col
    return out


def _range_layout(datasets):
    """Union of range keys (name, occurrence) in first-seen order, and each rank's positions in it."""
    keys: dict[tuple[str, int], int] = {}
    positions = []
    for ds in datasets:
        names = ds["name"].values.astype(str)
        count: dict[str, int] = {}
        pos = []
        for n in names.tolist():
            k = (n, count.get(n, 0))
            count[n] = k[1] + 1
            pos.append(keys.setdefault(k, len(keys)))
        positions.append(np.asarray(pos, dtype=np.int64))
    return list(keys), positions


def _merge_range(datasets, offsets):
    import xarray as xr

    from gpuscope._schema import dataset as _dataset

    keys, positions = _range_layout(datasets)
    n = len(keys)
    coords = {"occurrence": ("range", np.array([k[1] for k in keys], dtype=np.int64),
                             {"description": "how many earlier ranges of the same path the rank ran: "
                                             "(name, occurrence) identifies a range across ranks"})}
    for name in _KEY_COORDS:
        if all(name in ds.coords for ds in datasets):
            dtype, fill, cattrs = _dataset.RANGE_COORDS[name]
            values = np.full(n, fill, dtype=object)
            for ds, pos in zip(reversed(datasets), reversed(positions)):  # the lowest rank's value wins
                values[pos] = ds[name].values
            coords[name] = ("range", values.astype(dtype), cattrs)
    known = {**_dataset.RANGE_COORDS, **_dataset.SHAPE_COORDS, **_dataset.RESOURCE_COORDS}
    other = [c for c in dict.fromkeys(c for ds in datasets for c in ds.coords)
             if c not in coords and c != "range" and all(ds[c].dims == ("range",) for ds in datasets if c in ds.coords)]
    for name in other:
        present = [ds for ds in datasets if name in ds.coords]
        dtype = np.result_type(*[ds[name].dtype for ds in present])
        fill = known[name][1] if name in known else _fill(dtype)
        cols = [ds[name].values if name in ds.coords else np.full(ds.sizes["range"], fill) for ds in datasets]
        if name in ("start_ns", "end_ns") and offsets is not None:
            cols = [np.where(c >= 0, c + off, c) for c, off in zip(cols, offsets)]
        cattrs = dict(present[0][name].attrs)
        if name in ("start_ns", "end_ns") and offsets is not None:
            cattrs["clock"] = _WALL
        coords[name] = (("rank", "range"), _stack(cols, positions, n, dtype, fill), cattrs)
    data_vars = {}
    for name in dict.fromkeys(v for ds in datasets for v in ds.data_vars):
        cols = [ds[name].values if name in ds else np.full(ds.sizes["range"], np.nan) for ds in datasets]
        attrs = next(ds[name].attrs for ds in datasets if name in ds)
        data_vars[name] = xr.DataArray(_stack(cols, positions, n, np.float64, np.nan), dims=("rank", "range"),
                                       attrs=dict(attrs))
    return data_vars, coords


def _merge_pm(datasets, offsets, dim="rank", labels=None):
    """PM samples of several sessions along *dim* (``rank``, or ``device`` for :func:`gpuscope.combine_devices`):
    (dim, sample) variables and coords padded past each session's last sample, ``time`` from the earliest start,
    and the span and execution tables merged (:func:`_merge_tables`; *labels*: each session's rank or device).
    *offsets*: ns per session from its CUPTI clock to the wall clock, or None to keep CUPTI timestamps. Returns
    (data variables, coordinates, the time origin, the tables' attrs)."""
    import xarray as xr

    from gpuscope._schema.labels import string_labels

    n = max(ds.sizes["time"] for ds in datasets)
    positions = [np.arange(ds.sizes["time"]) for ds in datasets]
    moved = offsets
    clock = "cuptiGetTimestamp" if offsets is None else _WALL
    offsets = [0] * len(datasets) if offsets is None else offsets
    origin = min(int(ds.attrs["session_start_ns"]) + off for ds, off in zip(datasets, offsets))
    dims = (dim, "sample")
    coords = {}
    for name in ("start_ns", "end_ns"):
        cols = [ds[name].values.astype(np.int64) + off for ds, off in zip(datasets, offsets)]
        coords[name] = (dims, _stack(cols, positions, n, np.int64, -1),
                        {"units": "ns", "clock": clock, "description": f"-1 past the {dim}'s last sample"})
    times = [ds["end_ns"].values.astype(np.int64) + off - origin for ds, off in zip(datasets, offsets)]
    coords["time"] = (dims, _stack(times, positions, n, np.int64, -1),
                      {"units": "ns", "description": f"ns from time_origin_ns (the earliest {dim}'s session start) to "
                                                     f"the sample's end; -1 past the {dim}'s last sample"})
    if all("range" in ds.coords for ds in datasets):
        ranges = _stack([ds["range"].values for ds in datasets], positions, n, object, "")
        coords["range"] = (dims, string_labels(ranges, missing=""), dict(datasets[0]["range"].attrs))
    coords["samples"] = (dim, np.array([ds.sizes["time"] for ds in datasets], dtype=np.int64),
                         {"description": f"samples of each {dim} (the rest of its row is padding)"})
    labels = list(range(len(datasets))) if labels is None else list(labels)
    tables, rows = _merge_tables(datasets, SPAN_TABLE, moved, dim, labels, union=dim == "device")
    if any(SPAN_INDEX in ds.coords for ds in datasets):  # each sample's span, as a position in the merged table
        cols = [np.where(own >= 0, mine[np.maximum(own, 0)], -1) if mine.size else np.full(own.size, -1)
                for own, mine in zip([ds[SPAN_INDEX].values if SPAN_INDEX in ds.coords
                                      else np.full(ds.sizes["time"], -1) for ds in datasets], rows)]
        coords[SPAN_INDEX] = (dims, _stack(cols, positions, n, np.int64, -1),
                              {"description": SAMPLE_SPAN_ATTRS["description"] + f" or past the {dim}'s last sample"})
    tables.update(_merge_tables(datasets, EXEC_TABLE, moved, dim, labels, union=False)[0])
    data_vars = {}
    for name in dict.fromkeys(v for ds in datasets for v in ds.data_vars):
        cols = [ds[name].values if name in ds else np.full(ds.sizes["time"], np.nan) for ds in datasets]
        attrs = next(ds[name].attrs for ds in datasets if name in ds)
        data_vars[name] = xr.DataArray(_stack(cols, positions, n, np.float64, np.nan), dims=dims, attrs=dict(attrs))
    return data_vars, coords, origin, tables


def _merge_tables(datasets, table, offsets, along, labels, union):
    """One table (*table*: span or execution) from those of several sessions, as Dataset attrs, and for each
    session the position of each of its rows in it.

    ``union=False`` (ranks; executions): the tables one after the other, with the column ``<prefix><along>``
    (``span_rank``, ``exec_device``) saying whose each row is; times moved by *offsets* (None: not moved).
    ``union=True`` (spans of the devices of one process, which share one clock and one set of user ranges): each
    span once, identified by its path, thread and start; a span still open when the sessions stopped ends at the
    latest of its ends; ordered by start, longer first, as one session's table is."""
    names = list(table)
    held = [table_columns(ds, table) for ds in datasets]
    if all(h is None for h in held):
        return {}, [np.zeros(0, dtype=np.int64) for _ in datasets]
    sizes = [len(h[names[0]]) if h is not None else 0 for h in held]
    columns = {}
    for name, (dtype, _) in table.items():
        parts = [np.asarray(h[name] if h is not None else [], dtype=dtype) for h in held]
        if offsets is not None and name.endswith("_ns"):
            parts = [part + off for part, off in zip(parts, offsets)]
        columns[name] = np.concatenate(parts)
    where = np.arange(sum(sizes))  # each row's position in the merged table
    if union:
        path, thread, start, end = (columns[name] for name in names)
        first: dict = {}
        same = np.asarray([first.setdefault(key, r) for r, key in
                           enumerate(zip(path.tolist(), thread.tolist(), start.tolist()))], dtype=np.int64)
        latest = end.copy()
        np.maximum.at(latest, same, end)  # the latest end of each span, at its first row
        keep = np.flatnonzero(same == where)
        order = keep[np.lexsort((-latest[keep], start[keep]))]  # by start, longer first (stable)
        position = np.empty(where.size, dtype=np.int64)
        position[order] = np.arange(order.size)
        where = position[same]
        columns = {name: column[order] for name, column in columns.items()}
        columns[names[3]] = latest[order]
    else:
        columns[f"{names[0].split('_', 1)[0]}_{along}"] = np.repeat(np.asarray(labels, dtype=np.int64), sizes)
    return table_attrs(table, columns), np.split(where, np.cumsum(sizes)[:-1])


def _is_scalar(value) -> bool:
    return np.ndim(value) == 0 and isinstance(value, (str, int, float, np.integer, np.floating))


def split_attrs(datasets, dim, always, skip=()):
    """Attrs equal on every Dataset stay attrs; scalars that differ, and the keys of *always* (key -> fill where a
    Dataset lacks it), become coordinates along *dim*; *skip* is left out. Returns (attrs, coords, dropped): the
    list attrs that differ, which neither can hold."""
    keys = list(dict.fromkeys(k for ds in datasets for k in ds.attrs if k not in skip))
    attrs, coords, dropped = {}, {}, []
    for key in keys:
        values = [ds.attrs.get(key) for ds in datasets]
        same = all(v is not None for v in values) and all(np.array_equal(values[0], v) for v in values[1:])
        if same and key not in always:
            attrs[key] = values[0]
        elif key in always or all(v is None or _is_scalar(v) for v in values):
            present = [v for v in values if v is not None]
            fill = always.get(key, "" if any(isinstance(v, str) for v in present) else -1)
            column = [fill if v is None else v for v in values]
            if isinstance(fill, str):
                column = [str(v) for v in column]
            coords[key] = (dim, np.asarray(column))
        else:
            dropped.append(key)
    for key, fill in always.items():
        coords.setdefault(key, (dim, np.full(len(datasets), fill)))
    return attrs, coords, dropped


def _attrs(datasets, sources, ranks):
    """Attrs equal on every rank stay attrs; scalars that differ, and :data:`_RANK_ATTRS`, become rank coords."""
    attrs, coords, dropped = split_attrs(datasets, "rank", _RANK_ATTRS, _SKIP_ATTRS)
    coords["device"] = ("rank", np.asarray(coords.pop("device_index")[1], dtype=np.int64),
                        {"description": "CUDA device ordinal the rank profiled (its attr device_index)"})
    coords["file"] = ("rank", np.asarray([str(s) for s in sources], dtype=str))
    coords["rank"] = ("rank", np.asarray(ranks, dtype=np.int64))
    if dropped:
        attrs["per_rank_attrs_dropped"] = dropped
    return attrs, coords


def merge_ranks(datasets, sources=None):
    """Combine per-rank gpuscope Datasets (of one job) into one with a ``rank`` dimension, sorted by rank.

    * **Ranks** come from each Dataset's ``rank`` attr (stamped by gpuscope from the launcher's variables, or by
      :mod:`gpuscope.dask` / :mod:`gpuscope.mpi`). Datasets without one (older files) are numbered in the
      order given, with a warning.
    * **Rank coordinates**: ``rank``, ``host``, ``device`` (the device ordinal profiled), ``local_rank``,
      ``file``, ``session_start_ns``, ``wall_clock_ns``, and every scalar attr whose value differs between
      ranks (``created``, ``lost_samples``, ...). Attrs equal on every rank stay attrs. List attrs that differ are
      dropped and named in ``attrs["per_rank_attrs_dropped"]``.
    * **One clock**: each rank's CUPTI timestamps (``start_ns``, ``end_ns``) are moved to the wall clock with
      the pair recorded at its session start (``wall_clock_ns`` taken next to the CUPTI ``session_start_ns``):
      ``wall = cupti + wall_clock_ns - session_start_ns``. Within a host the ranks then agree to the few µs
      between the two clock reads; across hosts only as well as their wall clocks agree (NTP: typically 0.1-10
      ms; PTP: µs). If any rank lacks the pair (files from before gpuscope 0.2) nothing is moved and a
      :class:`~gpuscope.GpuscopeWarning` says so.
    * **Range results** (kind ``range``): ranges are matched across ranks by (``name``, ``occurrence``): the
      k-th range of a path on one rank meets the k-th of that path on the others. The ``range`` dim is the
      union (outer join) in first-seen order, lowest rank first; a rank that did not run a range has NaN in
      every metric there and the fill of :data:`gpuscope._schema.dataset.RANGE_COORDS` (-1, "") in its per-rank coords.
      ``name``, ``depth``, ``parent``, ``kernel`` and the new ``occurrence`` stay one value per range; every
      other range coordinate (``start_ns``, ``launch``, ``grid_x``, ...) becomes (rank, range).
    * **PM samples** (kind ``pm_sampling``): ranks sample at different instants and may hold different counts,
      so the sample dim becomes ``sample`` (a position) and ``time``, ``start_ns``, ``end_ns`` and ``range``
      are (rank, sample) coordinates; ``time`` counts ns from ``attrs["time_origin_ns"]``, the earliest rank's
      session start on the wall clock. Shorter ranks are padded: NaN metrics, -1 times, "" range; coordinate
      ``samples`` says how many each rank has. The span tables of the ranks (user ranges) follow one another in
      one table (attrs, as one rank's), lowest rank first, with the column ``span_rank`` saying whose each row
      is and ``span_start_ns`` / ``span_end_ns`` on the clock of ``start_ns``; ``span_index`` (rank, sample) is
      each sample's row in that table (-1: none, or padding). Likewise the execution tables (``kernels=True``),
      with ``exec_rank``. :func:`gpuscope.spans` and :func:`gpuscope.kernel_executions` of the merged Dataset
      give them with a ``rank`` column and ``start``/``end`` counted from ``time_origin_ns``.

    Parameters
    ----------
    datasets : sequence of xarray.Dataset
    sources : sequence of str, optional
        Where each Dataset came from (file names), for messages and the ``file`` coordinate.

    Returns
    -------
    xarray.Dataset
        Same ``kind`` as the inputs; attrs ``merged_ranks`` (count) and, for PM samples, ``time_origin_ns``.

    Raises
    ------
    gpuscope.errors.RankMergeError
        No Datasets; kinds other than range/pm_sampling; mixed kinds or chips; two Datasets of one rank (the
        message names their sources); some with a rank and some without.
    """
    import xarray as xr

    from gpuscope._schema.dataset import index, upgrade

    datasets = list(datasets)
    if not datasets:
        raise RankMergeError("nothing to merge: no Datasets given")
    for i, ds in enumerate(datasets):
        if not isinstance(ds, xr.Dataset):
            raise TypeError(f"merge takes xarray Datasets; item {i} is a {type(ds).__name__}")
    sources = [f"dataset {i}" for i in range(len(datasets))] if sources is None else [str(s) for s in sources]
    datasets = [upgrade(ds) for ds in datasets]  # Datasets of an older schema not read through open_dataset
    kind = _check_same(datasets, sources)
    ranks = _rank_of(datasets, sources)
    order = np.argsort(ranks, kind="stable")
    datasets, sources, ranks = [datasets[i] for i in order], [sources[i] for i in order], [ranks[i] for i in order]
    offsets = _clock_offsets(datasets, sources)
    attrs, rank_coords = _attrs(datasets, sources, ranks)
    tables = {}
    if kind == "range":
        data_vars, coords = _merge_range(datasets, offsets)
    else:
        data_vars, coords, origin, tables = _merge_pm(datasets, offsets, "rank", ranks)
        attrs["time_origin_ns"] = int(origin)
    attrs["merged_ranks"] = len(datasets)
    out = xr.Dataset(data_vars, coords={**rank_coords, **coords}, attrs={**attrs, **tables})
    return index(out)
