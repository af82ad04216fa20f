"""Host objects per device, chip and metric list (:class:`HostSetup`): made once, shared by the process's sessions.

What CUPTI's host API gives for a chip and a metric list (the profiler host object that evaluates counter data, the
config image, the pass count, each metric's properties) depends only on the chip and the metrics, and costs to make,
so sessions share one (:func:`host_for`). They stay when CUPTI forgets the process (the host API needs no GPU and no
attached CUPTI), but belong to the CUPTI that gpuscope's own detach lets go of: it drops them first (:func:`drop`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings

from gpuscope.errors import GpuscopeWarning

__all__ = ["HostSetup", "drop", "host_for"]

_lock = threading.Lock()
_hosts: dict[tuple, HostSetup] = {}


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


def drop() -> None:
    """Close and forget every host object, and the metric lists' own (:mod:`gpuscope._gpu.metric_lists`): they
    belong to the CUPTI that is going away (the detach's ``prepare``)."""
    from gpuscope._gpu import metric_lists as _lists

    with _lock:
        hosts = list(_hosts.values())
        _hosts.clear()
    for setup in hosts:
        _quietly_close(setup.host)
    _lists.forget_hosts()


def _quietly_close(obj) -> None:
    try:
        obj.close()
    except Exception as exc:  # cleanup never raises
        warnings.warn(f"gpuscope: closing {type(obj).__name__} failed: {exc}", GpuscopeWarning, stacklevel=3)


def _forget_in_child() -> None:  # after os.fork: a parent's thread may have held the lock
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
