"""Pure helpers over CUPTI timestamps (tested without a GPU): user ranges as the sampler saw them, the range
open at each sample, and samples that never arrived."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["Span", "RangeRecorder", "innermost_ranges", "count_lost"]


@dataclasses.dataclass(frozen=True)
class Span:
    """One user range as the sampler saw it: path, thread and CUPTI timestamps (ns)."""

    path: str
    thread: int
    start_ns: int
    end_ns: int


def innermost_ranges(times_ns: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    """For each time, the path of the innermost user range open then ("" where none), as an object array.

    "Innermost" is the most recently entered range still open; with ranges on several threads that is the
    latest ``range_push`` of any thread. The items are the spans' own ``str`` objects, so a path costs its length
    once, not once per time (a ``<U`` array would take 4 bytes per character of the longest path for every time:
    7.6 GB for a 10,000-character name over 200,000 samples).
    """
    times_ns = np.asarray(times_ns, dtype=np.int64)
    out = np.full(times_ns.shape, "", dtype=object)
    if not spans or times_ns.size == 0:
        return out
    events = sorted(
        [(s.start_ns, 1, i) for i, s in enumerate(spans)] + [(s.end_ns, 0, i) for i, s in enumerate(spans)]
    )  # at equal times, pops (0) before pushes (1)
    order = np.argsort(times_ns, kind="stable")
    open_spans: dict[int, None] = {}  # insertion-ordered: the last key is the innermost
    k = 0
    for idx in order:
        t = times_ns[idx]
        while k < len(events) and events[k][0] <= t:
            _, is_push, i = events[k]
            if is_push:
                open_spans[i] = None
            else:
                open_spans.pop(i, None)
            k += 1
        if open_spans:
            out[idx] = spans[next(reversed(open_spans))].path
    return out


def count_lost(start_ns, end_ns, interval_ns: float, session_end_ns: int | None = None) -> int:
    """Samples that never arrived: a gap of ``g`` ns between one sample's end and the next one's start stands
    for ``round(g / interval)`` samples, and so does the time from the last sample to *session_end_ns*
    (less one interval, the sample in flight at Stop)."""
    if interval_ns <= 0:
        return 0
    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    lost = int(np.rint(np.clip(start_ns[1:] - end_ns[:-1], 0, None) / interval_ns).sum())
    if session_end_ns is not None and end_ns.size:
        lost += max(0, int(round((session_end_ns - end_ns[-1]) / interval_ns)) - 1)
    return lost


class RangeRecorder:
    """User ranges as PM sampling saw them: the stamp log of :func:`gpuscope._range_profiling.ranges.add_stamp_log`
    (register :attr:`log`), on the CUPTI clock.

    A range's push and pop are stamped with the host's ``time.perf_counter_ns`` (tens of ns), not CUPTI's clock
    (``cuptiGetTimestamp`` through ctypes, about 1.5 us), and logged without a listener's dispatch: both ran inside
    the user's loop, twice a range (issue 52, item 13). The host times go to the CUPTI clock through *anchors*,
    pairs of the two clocks read together: one when the recorder is made, one at each drain of the decode thread
    (:meth:`anchor`, every 10-50 ms) and one at Stop. A time takes the offset between the clocks interpolated
    between the anchors around it (the nearest anchor's outside them), so the host clock's drift against CUPTI's
    (NTP slews ``CLOCK_MONOTONIC`` by at most 500 ppm) moves a stamp by at most 500 ppm of half the time between
    anchors (12.5 us at 50 ms; 0 where the two clocks run at one rate).
    """

    def __init__(self, timestamp, host_clock=time.perf_counter_ns):
        self._timestamp = timestamp
        self._host = host_clock
        self.events: list[tuple[int, bool, str, int]] = []  # (host ns, is_push, path, thread id)
        self.log = self.events.append
        self.anchors: list[tuple[int, int]] = []  # (host ns, CUPTI ns)
        self.anchor()

    def anchor(self) -> None:
        """Read both clocks together (the host's around CUPTI's, their midpoint kept)."""
        before = self._host()
        cupti = self._timestamp()
        after = self._host()
        self.anchors.append(((before + after) // 2, cupti))

    def to_cupti(self, host_ns) -> np.ndarray:
        """Host times (ns, ``host_clock``'s) on the CUPTI clock, through the anchors."""
        anchors = np.array(sorted(self.anchors), dtype=np.int64).reshape(-1, 2)
        host_ns = np.asarray(host_ns, dtype=np.int64)
        offset = np.interp(host_ns, anchors[:, 0], anchors[:, 1] - anchors[:, 0])
        return host_ns + np.rint(offset).astype(np.int64)

    def spans(self, open_until_ns: int) -> list[Span]:
        """Pair pushes with pops per thread, on the CUPTI clock (a pop without its push, logged after the push
        came, is left out); ranges still open end at *open_until_ns* (CUPTI clock). Reads no clock (it may come
        after CUPTI has let go of the process): the sampler anchors at Stop."""
        events = list(self.events)
        times = self.to_cupti([e[0] for e in events]).tolist() if events else []
        stacks: dict[int, list[tuple[str, int]]] = {}
        spans = []
        for t, (_, is_push, path, thread) in zip(times, events):
            stack = stacks.setdefault(thread, [])
            if is_push:
                stack.append((path, t))
            elif stack:
                p, t0 = stack.pop()
                spans.append(Span(p, thread, t0, t))
        for thread, stack in stacks.items():
            spans.extend(Span(p, thread, t0, open_until_ns) for p, t0 in stack)
        return sorted(spans, key=lambda s: (s.start_ns, -s.end_ns))
