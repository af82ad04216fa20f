"""CUDA graph launches in a kernel- or auto-mode session: counted, and their kernels named from activity records.

CUPTI's kernel replay, auto ranges and launch callbacks do not see the kernels inside a CUDA graph (``cuGraphLaunch``:
``torch.cuda.CUDAGraph.replay``, ``torch.compile(mode="reduce-overhead")``, CuPy graphs). The session's launch
recorder counts graph launches and keeps their CUPTI correlation IDs. At the first graph launch, :class:`GraphKernels`
opens CUPTI's kernel activity records (:class:`gpuscope.cupti.activity.KernelRecords`). They give every kernel
execution, graph kernel nodes included, with the correlation ID of the launch call that ran it, and only the records
of graph launches are kept: sessions without graph launches never open them, and the records of the launches kernel
replay profiles are dropped as they arrive. At the session's close the device is synchronised and the records
flushed; :meth:`GraphKernels.summary` gives the Dataset's attrs and the warning: the kernels by name (the names every
Dataset of the process gives them, :func:`gpuscope._schema.names.kernel_name`) with their executions and GPU time.
Where the records cannot be read (another CUPTI tool injected, CUPTI refusing), the count stands and the warning says
why the kernels are not named.
"""

from __future__ import annotations

import os
import threading

__all__ = ["GraphKernels", "WAYS"]

#: What the user can do instead, said after every graph warning.
WAYS = ("Graphs gpuscope copied as they were made are profiled node by node: call gpuscope.watch_graphs() before "
        "they are made, or start the session first (docs/graphs.md). "
        "Profile a graph launch as one row with a gpuscope.range around it in mode='user', or the stall reasons of "
        "its kernels one by one with gpuscope.pc_sample (docs/range-profiling.md, 'CUDA graphs').")


class GraphKernels:
    """The kernels of the CUDA graph launches of one session (module docstring).

    Parameters
    ----------
    records : bool
        Open kernel activity records at the first graph launch (kernel and auto modes). Without, graph launches
        are only counted, and the summary says that this mode does not name their kernels.
    """

    def __init__(self, records: bool = True):
        self._records = None  # the KernelRecords, once opened
        self._closed = False
        self._lock = threading.Lock()
        #: why the kernels of graph launches are not named ("" while they may be)
        self.unavailable = "" if records else "iteration mode does not read them"

    @property
    def records(self) -> list | None:
        """The records kept so far (:class:`gpuscope.cupti.activity.KernelRecord` tuples), or None where none are
        read: never opened (no graph launch), or refused (:attr:`unavailable` says why)."""
        return self._records.records if self._records is not None and not self.unavailable else None

    def may_open(self) -> bool:
        """Whether :meth:`open` would still try (not opened, not refused, not closed)."""
        return self._records is None and not self.unavailable and not self._closed

    def open(self, keep) -> None:
        """At the entry of a graph launch (on the launching thread, inside CUPTI's callback): open the records the
        first time, keeping those whose correlation ID *keep* accepts. Never raises: a refusal is kept for the
        summary, and later graph launches do not try again."""
        if not self.may_open():
            return
        if not self._lock.acquire(blocking=False):  # another thread is opening them: never waited for here
            return
        try:
            if not self.may_open():
                return
            if os.environ.get("CUDA_INJECTION64_PATH"):
                self.unavailable = ("another CUPTI tool is injected (CUDA_INJECTION64_PATH), and gpuscope leaves "
                                    "CUPTI's activity records to it")
                return
            from gpuscope.cupti.activity import KernelRecords

            records = KernelRecords(keep=keep)
            try:
                records.open()
            except Exception as exc:
                self.unavailable = f"CUPTI's kernel activity records could not be opened ({type(exc).__name__}: {exc})"
                return
            self._records = records
        finally:
            self._lock.release()

    def close(self, context=None) -> None:
        """Flush and close the records, after synchronising *context* (a ``PrimaryContext``; the records of kernels
        still running would come without end times). Safe to call twice; trouble is kept for the summary."""
        with self._lock:
            self._closed = True
            records = self._records
            if records is None or records.closed:
                return
        note = ""
        if context is not None:
            try:
                context.synchronize()
            except Exception as exc:
                note = f" (the device could not be synchronised first: {type(exc).__name__}: {exc})"
        try:
            records.close()
        except Exception as exc:
            self.unavailable = (f"CUPTI's kernel activity records could not be flushed ({type(exc).__name__}: "
                                f"{exc}){note}")

    def summary(self, launches: int, mode: str) -> tuple[dict, str]:
        """The Dataset attrs and the warning for *launches* graph launches heard in a *mode*-mode session.

        Attrs: ``graph_kernels`` (kernel name -> executions, in the order they first ran) and
        ``graph_kernels_gpu_ns`` (kernel name -> GPU time in ns, of the executions that have an end time), empty
        where the kernels are not named; ``graph_launches_unrecorded`` (graph launches with no kernel record, where
        some have); ``graph_kernels_unavailable`` (why the kernels are not named, where they are not).
        """
        from gpuscope._results.report_inputs import graph_launches_text, listed_kernels
        from gpuscope._schema.names import kernel_name

        records = self._records if not self.unavailable else None
        executions: dict[str, int] = {}
        gpu_ns: dict[str, int] = {}
        recorded = set()
        for r in self.records or ():
            name = kernel_name(r[0])
            executions[name] = executions.get(name, 0) + 1
            gpu_ns.setdefault(name, 0)
            if r[2] > r[1] > 0:
                gpu_ns[name] += int(r[2] - r[1])
            recorded.add(r[9])
        attrs = {"graph_kernels": executions, "graph_kernels_gpu_ns": gpu_ns}
        what = graph_launches_text(launches)
        why_not = "CUPTI's kernel replay, auto ranges and launch callbacks do not see the kernels inside a graph"
        if not executions:
            why = self.unavailable or _no_records(records)
            attrs["graph_kernels_unavailable"] = why
            return attrs, (f"{what} (cuGraphLaunch: torch.cuda.CUDAGraph.replay, torch.compile mode='reduce-overhead', "
                           f"CuPy graphs) ran unprofiled in this {mode}-mode session ({why_not}). Their kernels could "
                           f"not be named: {why}. {WAYS}")
        text = (f"{what} ran {sum(executions.values())} kernels that this {mode}-mode session could not profile "
                f"({why_not}): {listed_kernels(executions)} (ds.attrs['graph_kernels']; their GPU time in "
                "'graph_kernels_gpu_ns').")
        unrecorded = launches - len(recorded)
        if unrecorded > 0:
            attrs["graph_launches_unrecorded"] = unrecorded
            text += f" The kernels of {unrecorded} of them are not counted: {_no_records(records)}."
        return attrs, f"{text} {WAYS}"


def _no_records(records) -> str:
    """Why graph launches have no kernel record, as the warning and the attrs say it."""
    if records is None:
        return "CUPTI's kernel activity records were not opened"
    if records.errors:
        return f"{len(records.errors)} of CUPTI's activity buffers could not be read ({records.errors[0]})"
    if records.dropped:
        return f"CUPTI dropped {records.dropped} kernel activity record(s) (its buffers were full)"
    return "CUPTI delivered no kernel activity record for them"
