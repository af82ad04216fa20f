"""The switch that ``probes/probe_config_switch.py`` tries (its ``switch`` and ``notrial`` ways); not
part of gpuscope. On the H100 (CUPTI 13.0) CUPTI accepted some switches and then failed the next session
(``CUPTI_ERROR_INVALID_PARAMETER`` at ``PushRange``, or a pass left unsubmitted), gave NaN for other metrics, and
crashed the process (SIGSEGV) when the metrics or the modes changed (docs/measurements.md, "The fixed cost of a
session"), so gpuscope disables the profiler and enables a new one at each change of configuration. Below, the
design as it was tried, kept to ask the question again on a new CUPTI: a stopped range profiler configured for a
session: the kept one as it is, the kept one switched to another configuration, or a newly enabled one.

Each change of configuration used to disable the range profiler and enable a new one: 0.2-0.33 s a session on an
H100 (``Disable`` of the old one, then the first ``cuptiRangeProfilerStart`` of the new one; docs/measurements.md).
A profiler that is enabled and stopped, with nothing left to decode, is switched instead (:func:`switch`):

1. ``GetCounterDataSize`` for the new metrics: ``CounterDataImageInitialize`` takes no metric list and lays an
   image out for the object's last ``GetCounterDataSize``, so an image of other metrics is initialised only after it;
2. the image initialised (the one this profiler already had for that configuration, if any) and ``SetConfig``;
3. one empty pass (``Start``, ``Stop``, decode) and ``SetConfig`` again: CUPTI has accepted a ``SetConfig`` it could
   not carry out and refused the next ``Start`` (``CUPTI_ERROR_UNKNOWN``), which a session's first pass must not
   be the one to find out; the second ``SetConfig`` makes the session's first pass pass 0.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Wanted", "switch"]


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
