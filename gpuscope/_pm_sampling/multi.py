"""``gpuscope.sample(device="all")`` or ``device=[0, 1]``: PM sampling on several GPUs of this process at once, one
Dataset with a ``device`` dim.

Each device gets its own :class:`~gpuscope._pm_sampling.sampler.Sampler` (an independent CUPTI PM sampling session on that
device's primary context, with its own decode thread and evaluators). :class:`MultiSampler` starts them one after
the other and stops them all, whatever fails: a device that cannot start stops the ones already started, and an
exception in the ``with`` block (or in one device's stop) still stops every other device.

The Datasets are combined by :func:`combine_devices` in the layout :func:`gpuscope.merge_ranks` gives PM samples
of several ranks, with ``device`` in place of ``rank``: devices sample at their own instants, so the sample dim is
``sample`` (a position) and ``time``, ``start_ns``, ``end_ns`` and ``range`` are (device, sample) coordinates,
padded past each device's last sample. Time base: the samples of every device carry timestamps of CUPTI's clock
(``cuptiGetTimestamp``, one clock per process, the one user ranges are stamped with), so they are kept as they
are; ``time`` counts ns from the earliest device's session start (``attrs["time_origin_ns"]``). Unlike ranks of
different processes, devices are not moved by their own wall-clock links: the two reads of a link can be split by
another thread holding the GIL (up to ms), while the CUPTI clock needs no link. :func:`select_device` gives one
device's samples back as a Dataset of its own (dim ``time``), which every analysis takes.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from collections.abc import Mapping

import numpy as np

from gpuscope._pm_sampling.sampler import MAX_DEVICE, Sampler
from gpuscope._util import validate as _validate

__all__ = ["MultiSampler", "combine_devices", "select_device", "each_device", "requested_devices", "DeviceChoiceError",
           "LOSS_COUNTS"]

_FORMS = "an int, 'all', or a list of distinct device indices such as [0, 1]"

#: Per-device attrs that become coordinates along ``device`` even when equal: who the device is and its clock link.
_DEVICE_ATTRS = {"device_index": -1, "device_name": "", "session_start_ns": -1, "wall_clock_ns": -1}
#: What a device's session lost (counts): per-device coordinates, and their total in the attrs.
LOSS_COUNTS = ("lost_samples", "overflows", "discarded_samples", "images_lost", "evaluation_workers_lost",
               "kernel_records_dropped", "kernel_records_incomplete")
#: What a device's session lost (messages): per-device coordinates, and all of them in the attrs.
_LOSS_TEXTS = ("decode_errors", "kernel_record_errors")
#: Attrs that describe the combination, not any one device.
_COMBINED_ATTRS = ("time_origin_ns", "merged_devices")


class DeviceChoiceError(ValueError, TypeError):
    """A ``device`` of the wrong kind (a str other than ``"all"``, a list holding a non-integer). A ValueError, as
    every bad device choice is, and a TypeError, as ``gpuscope.sample(device="cuda:0")`` has always raised."""


def requested_devices(device) -> str | tuple[int, ...]:
    """``"all"``, or the distinct device indices of *device* in ascending order (no CUDA call).

    Raises
    ------
    ValueError
        A str other than ``"all"``, an empty list, an item that is not an integer, an index outside 0 to 1023, or
        a device given twice; the message names the forms allowed. Values of the wrong kind (the str, the
        non-integer item) raise :class:`DeviceChoiceError`, also a TypeError.
    """
    if isinstance(device, str):
        if device.strip().lower() == "all":
            return "all"
        raise DeviceChoiceError(f"device={device!r} is not a device choice: give {_FORMS}.")
    if isinstance(device, (bytes, bytearray, Mapping)):
        raise DeviceChoiceError(f"device={device!r} is not a device choice: give {_FORMS}.")
    try:
        items = list(device)
    except TypeError:
        raise DeviceChoiceError(f"device={device!r} is not a device choice: give {_FORMS}.") from None
    if not items:
        raise ValueError(f"device={device!r} names no device: give {_FORMS}.")
    bad = [d for d in items if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
    if bad:
        raise DeviceChoiceError(f"device={device!r}: {bad[0]!r} ({type(bad[0]).__name__}) is not a device index; "
                                f"give {_FORMS}.")
    items = [int(d) for d in items]
    outside = [d for d in items if not 0 <= d <= MAX_DEVICE]
    if outside:
        raise ValueError(f"device={device!r}: {outside[0]} is not a device index (0 to {MAX_DEVICE}); give {_FORMS}.")
    twice = sorted({d for d in items if items.count(d) > 1})
    if twice:
        raise ValueError(f"device={device!r} names device {twice[0]} more than once: one sampler per device; give "
                         f"{_FORMS}.")
    return tuple(sorted(items))


def _visible(requested) -> list[int]:
    """The devices to sample, checked against those this process sees (``cuDeviceGetCount``, nothing else)."""
    from gpuscope._gpu import device as _device

    count = _device.device_count()
    if requested == "all":
        return list(range(count))
    missing = [d for d in requested if d >= count]
    if missing:
        raise ValueError(f"device={list(requested)}: device {missing[0]} does not exist; this process sees {count} "
                         f"GPU(s): {', '.join(map(str, range(count)))}. Give indices among them, or device='all' "
                         "(CUDA_VISIBLE_DEVICES decides what is visible).")
    return list(requested)


class MultiSampler:
    """PM sampling on several devices at once; make it with ``gpuscope.sample(device="all")`` or
    ``device=[0, 1]``.

    Use it as a context manager (or :meth:`start` and :meth:`stop`) and read :attr:`dataset` afterwards: one
    Dataset with a ``device`` dim (see :func:`combine_devices`). Each device's own Dataset is in
    :attr:`datasets`.

    Attributes
    ----------
    devices : list of int
        The devices sampled (for ``"all"``: known once started).
    samplers : list of Sampler
        One per device, in the order of :attr:`devices` (made on start).
    """

    def __init__(self, metrics="pm-default", interval="100us", device="all", **options):
        self._requested = requested_devices(device)
        self._make = functools.partial(Sampler, metrics, interval, **options)
        self._make(device=0 if self._requested == "all" else self._requested[0])  # checks the rest, no CUDA yet
        if options.get("kernels") is True:
            raise ValueError("kernels=True records the kernel executions of one device (CUPTI's activity records "
                             "are collected once per process): sample one device with kernels=True, e.g. device=0.")
        self.devices: list[int] = [] if self._requested == "all" else list(self._requested)
        self.samplers: list[Sampler] = []
        self._stack: contextlib.ExitStack | None = None
        self._state = "new"
        self._dataset = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._close((exc_type, exc, tb))
        return False

    def start(self) -> "MultiSampler":
        """Start a sampler on every device, in order; if one cannot start, stop those already started.

        Raises
        ------
        ValueError
            A device this process does not see (raised before any sampler starts).
        NoGpuError
            No GPU is visible.
        SamplerBusyError, NotSinglePassError, UnknownMetricError, CuptiPermissionError, ProfilerBusyError
            From a device's :meth:`Sampler.start`.
        """
        if self._state != "new":
            raise RuntimeError(f"This sampler was already started (state: {self._state}); make a new one.")
        self._state = "failed"
        self.devices = _visible(self._requested)
        self.samplers = [self._make(device=d) for d in self.devices]
        with contextlib.ExitStack() as stack:  # a device that fails to start exits those entered before it
            for sampler in self.samplers:
                stack.enter_context(sampler)
            self._stack = stack.pop_all()
        self._state = "running"
        return self

    def stop(self) -> None:
        """Stop every device's sampler, even if stopping one fails (safe to call twice). Each warns of its own
        lost samples (:class:`GpuscopeWarning`)."""
        self._close((None, None, None))

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    def _close(self, exc_info) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            stack.__exit__(*exc_info)  # every device's Sampler.__exit__, last started first
        finally:
            self._state = "stopped"

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def lost_samples(self) -> int:
        """Samples lost on all devices together."""
        return sum(s.lost_samples for s in self.samplers)

    @property
    def datasets(self) -> dict:
        """Each device's own Dataset (dim ``time``), by device index.

        Raises
        ------
        RuntimeError
            Sampling has not been stopped yet, or did not start.
        """
        if self._state != "stopped":
            raise RuntimeError("No samples yet: read .dataset after the `with gpuscope.sample(device=...)` block "
                               "(or after .stop()).")
        return {d: s.dataset for d, s in zip(self.devices, self.samplers)}

    @property
    def dataset(self):
        """The samples of every device as one :class:`xarray.Dataset` (dims ``device``, ``sample``; see
        :func:`combine_devices`); built on first read.

        Raises
        ------
        RuntimeError
            Sampling has not been stopped yet, or did not start.
        """
        if self._dataset is None:
            self._dataset = combine_devices(self.datasets.values())
        return self._dataset


def combine_devices(datasets):
    """Combine the PM samples of several devices of one process into one Dataset with a ``device`` dim.

    What :class:`MultiSampler` does with its devices' Datasets. The layout is that of PM samples in
    :func:`gpuscope.merge_ranks`, with ``device`` for ``rank``:

    * dims ``device`` (ascending CUDA ordinals, from each Dataset's ``device_index``) and ``sample`` (a position):
      every metric is (device, sample); so are the coordinates ``time``, ``start_ns``, ``end_ns`` and ``range``.
      A device with fewer samples is padded: NaN metrics, -1 times, "" range; coordinate ``samples`` says how
      many each device has.
    * **One time base**: ``start_ns``/``end_ns`` stay CUPTI timestamps (one clock for the whole process, no
      per-device shift); ``time`` counts ns from ``attrs["time_origin_ns"]``, the earliest device's session
      start, to each sample's end. ``attrs["session_start_ns"]`` is that origin and ``attrs["wall_clock_ns"]``
      the wall clock there (the earliest device's clock link), so :func:`gpuscope.spans` and the wall clock
      work on the combined Dataset as on one device's.
    * **Per-device coordinates**: ``device_name``, ``session_start_ns``, ``wall_clock_ns``, the loss counts of
      :data:`LOSS_COUNTS` that any device records (``lost_samples``, ``overflows``, ``discarded_samples``, ...),
      and every other scalar attr that differs between devices. Loss is never hidden: the attrs hold each count's
      **total** over the devices (``attrs["lost_samples"]``) and every device's ``decode_errors``. Attrs equal on
      every device stay attrs; list attrs that differ are dropped and named in
      ``attrs["per_device_attrs_dropped"]``.
    * **The span table** (user ranges: the process's, which every device's session records alike) stays one table
      (attrs, as one device's): each span once (by path, thread and start; a range still open when the sessions
      stopped ends at the latest stop), ordered by start; ``span_index`` (device, sample) is each sample's row in
      it (-1: none, or padding). Execution tables (``kernels=True``, one device's each) follow one another in one
      table, with the column ``exec_device`` saying whose each row is.

    For one device's samples as a Dataset of its own (dim ``time``: phases, reports, plots), use
    :func:`select_device`; ``ds.to_dataframe()`` gives one row per (device, sample), padding included (drop it
    with ``df[df.time >= 0]``).

    Parameters
    ----------
    datasets : iterable of xarray.Dataset
        PM sampling Datasets of different devices, each from ``gpuscope.sample`` with an integer device.

    Returns
    -------
    xarray.Dataset
        ``kind="pm_sampling"``; attrs ``merged_devices`` (count) and ``time_origin_ns``.

    Raises
    ------
    TypeError
        An item is not an xarray Dataset.
    ValueError
        No Datasets; one that is not a single device's PM samples; two of the same device.
    """
    import xarray as xr

    from gpuscope._results.ranks import _merge_pm, split_attrs
    from gpuscope._schema.dataset import TABLE_ATTRS, upgrade

    datasets = [upgrade(_validate.dataset(ds, f"datasets[{i}]")) for i, ds in enumerate(datasets)]
    if not datasets:
        raise ValueError("combine_devices got no Datasets: give the PM samples of each device.")
    for i, ds in enumerate(datasets):
        if ds.attrs.get("kind") != "pm_sampling" or "time" not in ds.dims or "session_start_ns" not in ds.attrs:
            raise ValueError(f"datasets[{i}] is not one device's PM samples (kind 'pm_sampling' with dim 'time', from "
                             f"gpuscope.sample(device=N)); its dims: {list(ds.dims)}.")
    devices = [int(ds.attrs.get("device_index", -1)) for ds in datasets]
    if min(devices) < 0 or len(set(devices)) < len(devices):
        raise ValueError(f"combine_devices needs one Dataset per device; their device_index attrs are {devices} "
                         "(-1: none recorded).")
    order = np.argsort(devices)
    datasets, devices = [datasets[i] for i in order], [devices[i] for i in order]
    losses = [k for k in LOSS_COUNTS + _LOSS_TEXTS if any(k in ds.attrs for ds in datasets)]
    always = {k: fill for k, fill in _DEVICE_ATTRS.items() if any(k in ds.attrs for ds in datasets)}
    always.update({k: "" if k in _LOSS_TEXTS else 0 for k in losses})
    attrs, coords, dropped = split_attrs(datasets, "device", always, skip=(*_COMBINED_ATTRS, *TABLE_ATTRS))
    coords["device"] = ("device", np.asarray(devices, dtype=np.int64),
                        {"description": "CUDA device ordinal (each Dataset's attr device_index)"})
    del coords["device_index"]
    for key in losses:
        column = coords[key][1]
        if key in _LOSS_TEXTS:
            attrs[key] = "; ".join(f"device {d}: {text}" for d, text in zip(devices, column) if text)
        else:
            attrs[key] = int(column.astype(np.int64).sum())
        coords[key] = ("device", column, {"description": f"per device; attrs['{key}'] holds them all"})
    data_vars, sample_coords, origin, tables = _merge_pm(datasets, None, "device", devices)
    first = int(np.argmin([int(ds.attrs["session_start_ns"]) for ds in datasets]))
    attrs.update(session_start_ns=int(origin), time_origin_ns=int(origin), merged_devices=len(datasets))
    if "wall_clock_ns" in datasets[first].attrs:
        attrs["wall_clock_ns"] = int(datasets[first].attrs["wall_clock_ns"])
    if dropped:
        attrs["per_device_attrs_dropped"] = dropped
    return xr.Dataset(data_vars, coords={**coords, **sample_coords}, attrs={**attrs, **tables})


def select_device(ds, device: int):
    """One device's samples from a Dataset with a ``device`` dim, as the Dataset that device's own sampler gives
    (dim ``time``, its own ``session_start_ns``, ``lost_samples`` and other per-device attrs; padding dropped).

    It holds the combined span table (the process's user ranges: the device's own when every device saw the same
    ones, the usual case) and the device's rows of the execution table, if any.

    Parameters
    ----------
    ds : xarray.Dataset
        From :class:`MultiSampler` (``gpuscope.sample(device=[...]).dataset``), :func:`combine_devices`, or a
        file of one.
    device : int
        The CUDA device ordinal, one of ``ds["device"]``.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    TypeError
        *ds* is not a Dataset, or *device* is not an integer.
    ValueError
        *ds* has no ``device`` dim, or does not hold *device* (the message lists those it holds).

    Examples
    --------
    >>> with gpuscope.sample(device="all") as s:      # doctest: +SKIP
    ...     run()
    >>> gpuscope.phases(gpuscope.select_device(s.dataset, 1))  # doctest: +SKIP
    """
    import xarray as xr

    from gpuscope._results import build as _results
    from gpuscope._schema import dataset as _dataset

    ds = _validate.dataset(ds, "ds")
    if "device" not in ds.dims:
        raise ValueError(f"select_device takes the samples of several devices (dim 'device', from "
                         f"gpuscope.sample(device=[...])); this Dataset has dims {list(ds.dims)}.")
    device = _validate.integer(device, "device", minimum=0, maximum=MAX_DEVICE)
    held = [int(d) for d in ds["device"].values]
    if device not in held:
        raise ValueError(f"device={device} is not in this Dataset; it holds devices {held}.")
    one = ds.sel(device=device)
    one = one.isel(sample=slice(0, int(one["samples"])))
    attrs = {k: v for k, v in ds.attrs.items() if k not in _COMBINED_ATTRS and k not in _dataset.TABLE_ATTRS}
    for name in [c for c in ds.coords if ds[c].dims == ("device",) and c not in ("device", "samples")]:
        attrs[name] = one[name].item()
    attrs["device_index"] = device
    for key, fill in _DEVICE_ATTRS.items():
        if key in attrs and attrs[key] == fill:
            del attrs[key]  # the device did not record it (another did): its own Dataset has none
    spans = _dataset.table_columns(ds, _dataset.SPAN_TABLE)
    table = {k: spans[k].tolist() if spans is not None else [] for k in _dataset.SPAN_VARS}
    ranges = one["range"].values if "range" in one.coords else None
    coords = _results.sample_coords(one["start_ns"].values, one["end_ns"].values, int(attrs["session_start_ns"]),
                                    table, ranges)
    if ranges is not None:
        coords["range"].attrs = dict(one["range"].attrs)  # as the device's Dataset had them
    if _dataset.SPAN_INDEX in one.coords:  # as combined, not derived again
        coords[_dataset.SPAN_INDEX].values = one[_dataset.SPAN_INDEX].values.astype(np.int64)
    if spans is not None:
        attrs.update(_dataset.table_attrs(_dataset.SPAN_TABLE, {k: spans[k] for k in _dataset.SPAN_VARS}))
    runs = _dataset.table_columns(ds, _dataset.EXEC_TABLE)
    if runs is not None:
        mine = runs["exec_device"] == device if "exec_device" in runs else slice(None)
        attrs.update(_dataset.table_attrs(_dataset.EXEC_TABLE, {k: runs[k][mine] for k in _dataset.EXEC_VARS}))
    data_vars = {name: xr.DataArray(one[name].values, dims="time", attrs=dict(one[name].attrs))
                 for name in one.data_vars}
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)


def each_device(ds) -> list:
    """One Dataset per device: :func:`select_device` of each device of a Dataset with a ``device`` dim, else
    ``[ds]`` (what the command line reports and traces)."""
    if "device" not in ds.dims:
        return [ds]
    return [select_device(ds, int(d)) for d in ds["device"].values]
