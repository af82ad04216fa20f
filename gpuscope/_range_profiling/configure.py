"""A stopped range profiler configured for a session: the kept one as it is, the kept one switched to another
configuration, or a newly enabled one (the fallback wherever CUPTI refuses a switch).

Each change of configuration used to disable the range profiler and enable a new one: 0.2-0.33 s a session on an
H100 (``Disable`` of the old one, then the first ``cuptiRangeProfilerStart`` of the new one; docs/measurements.md).
A profiler that is enabled and stopped, with nothing left to decode, is switched instead (:func:`switch`):

1. ``GetCounterDataSize`` for the new metrics: ``CounterDataImageInitialize`` takes no metric list and lays an
   image out for the object's last ``GetCounterDataSize``, so an image of other metrics is initialised only after it;
2. the image initialised (the one this profiler already had for that configuration, if any) and ``SetConfig``;
3. one empty pass (``Start``, ``Stop``, decode) and ``SetConfig`` again: CUPTI has accepted a ``SetConfig`` it could
   not carry out and refused the next ``Start`` (``CUPTI_ERROR_UNKNOWN``), which a session's first pass must not
   be the one to find out; the second ``SetConfig`` makes the session's first pass pass 0.

Where any step fails with a CUPTI error the profiler is disabled and a new one enabled, as before, and the same kind
of change is not tried again in the process. CUPTI may keep pointers to the images of earlier configurations: they
stay alive as long as the profiler (:class:`gpuscope.cupti.range_profiler.RangeProfiler` keeps every buffer given
to ``SetConfig``), a switch back reuses its configuration's image, and past :data:`MAX_IMAGES` configurations a
change enables a new profiler. ``GPUSCOPE_SWITCH_CONFIG=0`` never switches.
``benchmarks/probes/probe_config_switch.py`` measures each step and checks the values against a new profiler's.
"""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np

__all__ = ["ENABLED", "KEPT", "MAX_IMAGES", "SWITCHED", "SWITCH_ENV", "Wanted", "configure", "switch", "switchable"]

#: ``GPUSCOPE_SWITCH_CONFIG=0`` (or off, no, false): a change of configuration always enables a new range profiler.
SWITCH_ENV = "GPUSCOPE_SWITCH_CONFIG"
#: Configurations whose counter-data images one profiler holds at most; past it a change enables a new profiler.
MAX_IMAGES = 8
#: How :func:`configure` got the profiler.
KEPT, SWITCHED, ENABLED = "kept", "switched", "enabled"

_refused: set = set()  # kinds of change (:func:`_kind`) CUPTI refused in this process: not tried again
_refused_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A range-profiler configuration: its key (everything it depends on, the context handle first), the config
    image, the counter-data image's metrics and SetConfig's arguments."""

    key: tuple
    config: np.ndarray
    metrics: tuple
    range_mode: int
    replay_mode: int
    ranges: int
    depth: int = 1

    def set_config(self, rp, image: np.ndarray) -> None:
        rp.set_config(self.config, image, self.range_mode, self.replay_mode, self.ranges, self.depth, 1, 0, 1)


def _kind(old: tuple, new: tuple) -> tuple:
    """What a change of configuration changes, as remembered when CUPTI refuses it: the range and replay modes
    before and after (key items 3 and 4), and whether the metrics (items 1 and 2) change."""
    return old[3:5], new[3:5], old[1:3] != new[1:3]


def switchable(old: tuple | None, new: tuple) -> bool:
    """Whether a range profiler configured as *old* (None: unknown, e.g. passes of a dropped group submitted) may be
    switched to *new*: a range profiler's key (not a PM sampler's) on the same context, switching not turned off
    (:data:`SWITCH_ENV`), and no change of this kind refused in this process."""
    if old is None or len(old) != len(new) or old[0] != new[0] or old == new:
        return False
    if os.environ.get(SWITCH_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    with _refused_lock:
        return _kind(old, new) not in _refused


def switch(rp, images: dict, wanted: Wanted, trial: bool = True) -> np.ndarray:
    """Configure the enabled, stopped range profiler *rp* as *wanted* (module docstring); *images* are its
    counter-data images by key, the new one added. Returns the image. *trial*: the empty pass and second
    SetConfig (the probe measures without them too).

    Raises
    ------
    CuptiError
        CUPTI refused a step: *rp* is in an unknown state (disable it).
    """
    size = rp.counter_data_size(wanted.metrics, wanted.ranges)
    image = images.get(wanted.key)
    if image is None or image.size != size:
        image = np.zeros(size, dtype=np.uint8)
    rp.initialize_counter_data(image)
    images[wanted.key] = image  # CUPTI points at it from the SetConfig on: it lives as long as the profiler
    wanted.set_config(rp, image)
    if trial:
        rp.start()
        rp.stop()
        rp.decode()
        rp.initialize_counter_data(image)
        wanted.set_config(rp, image)
    return image


def configure(rp, key: tuple | None, images: dict, wanted: Wanted, enable) -> tuple[object, np.ndarray, str]:
    """A stopped range profiler configured as *wanted*, its counter-data image, and how it was had (:data:`KEPT`,
    :data:`SWITCHED`, :data:`ENABLED`, or ``"enabled: the switch was refused (...)"``).

    *rp* is an enabled, stopped profiler configured as *key* (None: state unknown) with counter-data images
    *images* by key, or None; it is reused, switched, or disabled. ``enable()`` enables and configures a new one
    and returns it with its image. *images* is updated in place to the returned profiler's. Whatever raises,
    nothing is left enabled that the caller does not get back.
    """
    from gpuscope.errors import CuptiError

    if rp is not None and key == wanted.key and key in images:
        return rp, images[key], KEPT
    refused = None
    if rp is not None:
        switched = False
        try:
            if switchable(key, wanted.key) and (len(images) < MAX_IMAGES or wanted.key in images):
                try:
                    image = switch(rp, images, wanted)
                    switched = True
                    return rp, image, SWITCHED
                except CuptiError as exc:
                    with _refused_lock:
                        _refused.add(_kind(key, wanted.key))
                    refused = exc
        finally:
            if not switched:  # not switchable, refused, or interrupted: CUPTI's pointers go with the profiler
                rp.close()
                images.clear()
    rp, image = enable()
    images[wanted.key] = image
    if refused is None:
        return rp, image, ENABLED
    return rp, image, f"{ENABLED}: the switch was refused ({type(refused).__name__}: {refused})"[:300]
