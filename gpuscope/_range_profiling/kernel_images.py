"""Kernel mode's counter-data images: emptied into rows when full and at the close, and the kernel-replay cost warning.

CUPTI's kernel replay makes one range per launch in a small image; the launch that would not fit empties it first
(:meth:`KernelImages._flush_kernels`), so that a session of any length needs no image sized in advance. At the close,
the time launches took says whether replay cost more than expected, and why: the device memory CUPTI restores before
each pass, or modules built with relocatable device code (:mod:`gpuscope._gpu.modules`). :class:`KernelImages` is a
mixin of :class:`gpuscope._range_profiling.modes.PerLaunchModes`.
"""

from __future__ import annotations

import numpy as np

from gpuscope._range_profiling.entry import _readable, _warn
from gpuscope._range_profiling.rows import evaluate_range

__all__ = ["KernelImages"]


class KernelImages:
    """Kernel mode's collection (a mixin of :class:`gpuscope.Profiler`: it uses the session's state)."""

    def _flush_kernels(self) -> None:
        """Kernel mode, the counter-data image full (called at the entry of the launch that would not fit): collect
        what it holds and go on with it emptied."""
        collector = self._collector
        if not collector.paused:
            self._rp.stop()
        self._collect_kernels()
        self._rp.start()
        collector.paused = False
        self._notes["image_flushes"] = self._notes.get("image_flushes", 0) + 1

    def _collect_kernels(self) -> None:
        """Decode and evaluate the launches the image holds (those since the last flush)."""
        from gpuscope.cupti import range_profiler

        dropped = self._rp.decode()
        image = self._image
        collector = self._collector
        first = collector.image_first
        launches = collector.selected[first:]
        collector.image_first = len(collector.selected)
        count = range_profiler.num_ranges(image)
        if not dropped and count == self.max_ranges < len(launches):
            # a full image of the size the user fixed: CUPTI kept the first ranges and dropped the later launches
            # without counting them
            dropped = len(launches) - count
            launches = launches[:count]
            self._notes["launches_dropped"] = self._notes.get("launches_dropped", 0) + dropped
            _warn(f"{dropped} launch(es) did not fit the counter-data image and were dropped; pass "
                  f"gpuscope.Profiler(max_ranges=...) larger than {self.max_ranges}.")
            dropped = 0
        elif dropped:
            _warn(f"{dropped} launch(es) did not fit the counter-data image and were dropped; pass "
                  f"gpuscope.Profiler(max_ranges=...) larger than {self.max_ranges}.")
        if count != len(launches) - dropped and any(s.concurrent for s in launches):
            real = [s for s in launches if not s.concurrent]  # CUPTI made no range of the concurrent launches
            if count == len(real) - dropped:
                launches = real
        if count != len(launches) - dropped:
            _warn(f"CUPTI returned {count} kernel ranges for {len(launches)} recorded launches; the launches cannot "
                  "be told apart, so rows are named by CUPTI's range names without kernel names.")
            launches = None
        for index in range(count):
            values = evaluate_range(self, image, index)
            if launches is None:
                name = range_profiler.range_name(image, index, "/")
                self._rows.append({"name": name, "depth": 1, "parent": "", "launch": -1, "values": values,
                                   "pass_group": 0, "first_iteration": 0, "iterations": 1})
            elif launches[index].concurrent:  # a placeholder: its range is another thread's unprofiled launch
                continue
            elif launches[index].overlapped:  # CUPTI's order of it and a concurrent launch is not known
                self._unsafe["overlapped"] += 1
            else:
                self._rows.append(self._launch_row(launches[index], launches[index].launch_id, values, 0, 0, 1,
                                                   "kernel"))
        self._rp.initialize_counter_data(image)

    def _finish_kernels(self) -> None:
        self._collect_kernels()
        replay_ms = [(s.exit_ns - s.enter_ns) / 1e6 for s in self._collector.selected if s.exit_ns > 0]
        if replay_ms:
            self._notes["replay_ms_per_launch"] = float(np.median(replay_ms))
            # judged on the launches after the first, which may pay one-time costs (seen: 120 ms after a PC
            # sampling block, then 40; 147 ms for the second launch after CUPTI was detached)
            self._warn_replay_cost(float(np.median(replay_ms[1:] if len(replay_ms) > 1 else replay_ms)),
                                   len(replay_ms) - 1)

    def _warn_replay_cost(self, ms: float, judged: int | None = None) -> None:
        """Kernel replay dearer than expected, or memory that makes it dear: say what was observed, and what is
        cheaper. Causes are named only when seen: the memory this process holds, and loaded modules built with
        relocatable device code (read from their cubins as they loaded, :mod:`gpuscope._gpu.modules`)."""
        if self.passes < 2:
            return
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import modules as _modules

        device_gib = _device.memory_used_gib(self.device)
        own_gib = _device.process_memory_gib(self.device)
        held = device_gib if own_gib is None else own_gib
        whose = "the device has" if own_gib is None else "this process holds"
        expected = (_REPLAY_FIXED_MS + _REPLAY_PASS_MS * self.passes
                    + _REPLAY_RESTORE_MS_PER_GIB * held * (self.passes - 1))
        seen = _modules.seen()
        dear = ms > 1.8 * expected
        if dear and not seen.relocatable and judged is not None and judged < _REPLAY_JUDGED:
            dear = False  # a time with no cause seen says nothing on one or two launches
        if not dear and held < _REPLAY_WARN_GIB:
            return
        causes = []
        if held >= _REPLAY_WARN_GIB:
            causes.append(f"{whose} {held:.1f} GiB of device memory in use, which CUPTI's kernel replay restores "
                          f"before each of the {self.passes - 1} passes after the first")
        if dear and seen.relocatable:
            names = sorted({n for kernels, _ in seen.relocatable for n in kernels})
            causes.append(f"{len(seen.relocatable)} loaded module(s) were built with relocatable device code "
                          f"({', '.join(_readable(n) for n in names[:3]) or 'no named kernel'}: "
                          f"{seen.relocatable[0][1][0]}); with one loaded, CUPTI restores much more per pass "
                          "(measured on an H100: 48-90 ms per launch instead of 40)")
        if dear and not seen.relocatable:
            heard = (f"none of the {seen.loaded} module(s) loaded while gpuscope sessions were open in this process "
                     "was built with relocatable device code (modules loaded outside sessions were not inspected)"
                     if seen.watching else f"the loaded modules could not be inspected ({seen.error})")
            causes.append(f"the cause is unknown: {whose} {held:.1f} GiB in use (about {expected:.0f} ms expected "
                          f"with it on an H100) and {heard}")
        _warn(f"Kernel replay cost {ms:.0f} ms per launch here ({self.passes} passes): " + "; ".join(causes)
              + ". mode='iteration' (pass k on the k-th iteration of a repeated top-level range, or between "
              "Profiler.step() calls) saves and restores nothing: about 1.1 ms per launch per pass on an H100, "
              "whatever the memory held.")
        self._notes.update(replay_memory_gib=round(held, 2), replay_memory_scope="process" if own_gib is not None
                           else "device", relocatable_modules=len(seen.relocatable))


# CUPTI kernel replay per launch on an H100 (CUPTI 13.0; docs/measurements.md): about 11 ms, plus 3.5 ms per
# pass, plus a restore of the device memory in use before every pass after the first (about 0.6 ms per GiB).
_REPLAY_FIXED_MS, _REPLAY_PASS_MS, _REPLAY_RESTORE_MS_PER_GIB = 11.0, 3.5, 0.62
_REPLAY_WARN_GIB = 4.0
_REPLAY_JUDGED = 3  # launches after the first before a cost alone (no cause seen) is warned about
