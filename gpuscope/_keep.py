"""What range-profiling sessions keep between them in a process: the enabled range profiler, host objects.

Measured on an H100 with CUPTI 13.0 (``benchmarks/probe_session_keep.py``, docs/measurements.md):

* the first ``cuptiRangeProfilerStart`` after ``cuptiRangeProfilerEnable`` costs 150-220 ms with a 16-range
  counter-data image, 1.3 s with 1,024 ranges and 4.6 s with 4,096, and ``Disable`` 13 ms to 0.5 s the same way;
* on a profiler kept enabled with the same config and image, a whole one-range session (re-initialised image,
  Start, range, Stop, decode, evaluate) costs 4.5 ms;
* ``SetConfig`` with *another* config on a profiler that has already collected makes the next ``Start`` fail
  (``CUPTI_ERROR_UNKNOWN``) and a later session crash; re-enabling with a counter-data image made by an earlier
  profiler object crashes too;
* a range profiler kept enabled makes PM sampling fail (``HARDWARE_BUSY``) and PC sampling deliver no records.

So a session that ends cleanly hands its profiler, config and counter-data image here (:func:`keep`); the next
session on the same device and context with exactly the same configuration takes them back (:func:`take`), and
anything else releases them first. PM and PC sampling call :func:`release` before they enable; so do process
exit, a forked child (which forgets, never touches, its parent's), and :func:`gpuscope.release`.

Host-side objects (the profiler host object, config image and pass count per chip and metric list) are cached
too (:func:`host_for`): they depend only on the chip and the metrics.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import warnings

from .errors import GpuscopeWarning

__all__ = ["Kept", "HostSetup", "take", "keep", "release", "kept_devices", "host_for", "enabled"]

#: Set GPUSCOPE_KEEP=0 to make every session enable and disable its own profiler (as before caching).
ENV = "GPUSCOPE_KEEP"

_lock = threading.Lock()
_kept: dict[int, Kept] = {}
_hosts: dict[tuple, HostSetup] = {}


def enabled() -> bool:
    """Whether sessions keep their range profiler for the next one (``GPUSCOPE_KEEP`` not ``0``)."""
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


@dataclasses.dataclass
class Kept:
    """An enabled, stopped range profiler with its configuration and a re-initialised counter-data image."""

    key: tuple  # (context, metrics, range mode, replay mode, ranges, nesting levels)
    context_id: int  # the context's unique id: a context destroyed and made again at the same address differs
    context: object  # the retained PrimaryContext (released with the profiler)
    profiler: object  # gpuscope.cupti.range_profiler.RangeProfiler
    config: object
    image: object


@dataclasses.dataclass
class HostSetup:
    """What the host API gives for a chip and metric list: the host object (for evaluation), config image, passes
    and each metric's properties."""

    host: object
    config: object
    passes: int
    properties: dict


def host_for(device: int, chip: str, metrics: tuple, make) -> HostSetup:
    """The cached :class:`HostSetup` for *chip* and *metrics*, made by ``make()`` the first time (one per device:
    sessions on several devices at once evaluate on their own host objects)."""
    key = (device, chip, tuple(metrics))
    with _lock:
        setup = _hosts.get(key)
    if setup is None:
        setup = make()
        with _lock:
            setup = _hosts.setdefault(key, setup)
    return setup


def take(device: int, key: tuple, context_id: int) -> Kept | None:
    """The kept profiler of *device* if its configuration is *key* on the same live context, else None (whatever
    was kept is released first: CUPTI does not let an enabled profiler change its configuration)."""
    with _lock:
        kept = _kept.pop(device, None)
    if kept is None:
        return None
    if kept.key == key and kept.context_id == context_id:
        return kept
    _release(kept, alive=kept.context_id == context_id)
    return None


def keep(device: int, kept: Kept) -> None:
    """Hold *kept* for the next session on *device* (one per device; an older one is released)."""
    with _lock:
        old = _kept.pop(device, None)
        _kept[device] = kept
    if old is not None:
        _release(old)


def release(device: int | None = None) -> int:
    """Give back the GPU counters that gpuscope keeps between range-profiling sessions.

    A range-profiling session that ends cleanly leaves its CUPTI range profiler enabled, so that the next session
    with the same metrics and mode starts in milliseconds instead of 0.2-1.5 s. While it is kept, the counters are
    held: another profiler in this process (a CUPTI client other than gpuscope) cannot take them. gpuscope releases
    them itself before PM and PC sampling, when a session needs another configuration, and at process exit; call
    this before handing the GPU to another tool in the same process. ``GPUSCOPE_KEEP=0`` turns keeping off.

    Parameters
    ----------
    device : int, optional
        The device whose profiler to release; None (default): every device.

    Returns
    -------
    int
        How many kept profilers were released.
    """
    with _lock:
        devices = list(_kept) if device is None else [device]
        gone = [_kept.pop(d) for d in devices if d in _kept]
    for kept in gone:
        _release(kept)
    return len(gone)


def kept_devices() -> list[int]:
    """Devices on which a range profiler is kept now."""
    with _lock:
        return sorted(_kept)


def _release(kept: Kept, alive: bool = True) -> None:
    from .cupti import profiler

    try:
        if alive:
            kept.profiler.close()
        else:  # its context is gone, and CUPTI's state with it: do not touch the profiler
            kept.profiler._finalizer.detach()
        profiler.deinitialize()
        kept.context.close()
    except Exception as exc:  # cleanup never raises
        warnings.warn(f"gpuscope: releasing the kept range profiler failed: {exc}", GpuscopeWarning, stacklevel=3)


def _forget_in_child() -> None:
    """After ``os.fork``: the parent's profiler is not the child's to disable."""
    global _lock
    _lock = threading.Lock()
    for kept in _kept.values():
        kept.profiler._finalizer.detach()
    _kept.clear()


def _at_exit() -> None:
    release()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_at_exit)
