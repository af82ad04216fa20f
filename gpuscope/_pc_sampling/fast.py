"""The fast Top-Down: the stall split from PC samples and IPC from one range pass, joined or collected in one call.

:func:`fast_topdown` combines the two Datasets (:func:`stall_percentages` turns the PC samples into the stall
metrics Top-Down reads); :func:`profile_fast_topdown` collects them. It runs the work twice: first under PC
sampling, then as the range pass of an iteration-mode session (the ``fast-topdown`` set: executed and issued IPC,
threads per instruction, cycles) whose counter-data image is sized from the launches the PC block counted. PC
sampling cannot share launches with a range pass: on the H100 (CUPTI 13.0) CUPTI counts no PC samples at all while
a range pass collects, whichever was opened first (``benchmarks/bench_fast_topdown.py together``). PC sampling
comes first, with no session of gpuscope open, so that it can detach CUPTI (:func:`gpuscope._gpu.keep.detach_cupti`):
kernels that earlier sessions of the process profiled are then sampled too.
"""

from __future__ import annotations

import warnings

from gpuscope._util import validate as _validate
from gpuscope.errors import GpuscopeError, GpuscopeWarning

__all__ = ["profile_fast_topdown", "fast_topdown", "stall_percentages", "FAST_SET"]

FAST_SET = "fast-topdown"
#: PC sampling's hardware buffer in fast Top-Down's block, tried first: on the H100 a warm block around a 1 ms slice
#: took 0.17 s with it against 0.43 s with CUPTI's 512 MiB (which CUPTI sets up at the first launch, reads and frees),
#: with the same 145,000 samples (``probes/probe_fast_cost.py``). It holds about 2.5 M samples (some
#: 10 ms of GPU time at period 2**10); where it fills, the block runs again with CUPTI's 512 MiB.
FIRST_BUFFER = 32 << 20


class FastTopDownError(GpuscopeError, ValueError):
    """The two halves of a fast Top-Down do not fit together (no common kernel, no PC samples)."""


def stall_percentages(pc, counter_names: bool = True):
    """Per-kernel warp-state percentages from PC samples, as the counter metrics Top-Down reads.

    Each kernel's samples over all warp states are 100%. With ``counter_names``, variables are named like the
    counter metrics (``smsp__warp_issue_stalled_<reason>_per_warp_active.pct``; ``no_instructions`` becomes
    ``no_instruction``) so that :func:`gpuscope.metrics.topdown.topdown` reads them.

    Returns
    -------
    xarray.Dataset
        Dim ``kernel``.
    """
    import xarray as xr

    from gpuscope.metrics.topdown import STALL_PARENT, stall_metric

    counts = pc["kernel_samples"].astype(float)
    pct = 100.0 * counts / counts.sum("stall_reason").where(lambda t: t > 0)
    out = {}
    for reason in pc["stall_reason"].values.tolist():
        name = "no_instruction" if reason == "no_instructions" else reason
        key = stall_metric(name) if counter_names else reason
        out[key] = pct.sel(stall_reason=reason, drop=True).assign_attrs(units="percent", source="pc_sampling")
    if counter_names:
        # A state the GPU has but CUPTI did not list, or that had no samples, is 0%, not missing.
        zero = xr.zeros_like(pct.isel(stall_reason=0, drop=True)).assign_attrs(units="percent", source="pc_sampling")
        for name in STALL_PARENT:
            out.setdefault(stall_metric(name), zero)
    return xr.Dataset(out, attrs=dict(pc.attrs))


def fast_topdown(pc, ipc, levels=(1, 2, 3), arch=None, check: str = "ignore"):
    """Top-Down from one range-profiler pass (IPC, issued IPC, warp efficiency) and PC-sampled stall shares.

    Parameters
    ----------
    pc : xarray.Dataset
        A PC-sampling Dataset (``pc_sample(...).dataset``).
    ipc : xarray.Dataset
        Dim ``kernel`` (names as in ``pc.kernel``) with ``smsp__inst_executed.avg.per_cycle_active``,
        ``smsp__inst_issued.avg.per_cycle_active`` and ``smsp__thread_inst_executed_per_inst_executed.ratio``.
    levels, arch, check
        As for :func:`gpuscope.metrics.topdown.topdown`; ``arch`` defaults to the compute capability in the
        attrs of *pc*; ``check`` defaults to ``"ignore"`` here (PC-sampled shares sum to 100% by construction).

    Returns
    -------
    xarray.Dataset
        The hierarchy per kernel; attr ``topdown_source="fast: 1 range pass + PC sampling"``.

    Raises
    ------
    ValueError
        A kernel of *ipc* has no PC samples.
    """
    from gpuscope.metrics import topdown as td

    stalls = stall_percentages(pc)
    missing = sorted(set(ipc["kernel"].values.tolist()) - set(stalls["kernel"].values.tolist()))
    if missing:
        raise ValueError(f"no PC samples for kernel(s) {missing}; PC-sampled kernels: {stalls['kernel'].values.tolist()}")
    merged = ipc.merge(stalls.sel(kernel=ipc["kernel"]), join="left", compat="override")
    merged.attrs = {**stalls.attrs, **ipc.attrs}
    result = td.topdown(merged, levels=levels, arch=arch or pc.attrs.get("compute_capability"), check=check)
    result.attrs["topdown_source"] = "fast: 1 range pass + PC sampling"
    return result


def profile_fast_topdown(work, *args, period: int = 2**10, device: int = 0, levels=(1, 2, 3), check: str = "warn",
                         pc_sampler=None, profiler=None, **kwargs):
    """Top-Down per kernel from PC samples and one range pass: ``work(*args, **kwargs)`` runs twice.

    Parameters
    ----------
    work : callable
        Launches the kernels (it is called twice; once more where the PC block could not count its launches, and
        once more where its samples filled the first PC block's 32 MiB hardware buffer, :data:`FIRST_BUFFER`;
        it should do the same work each time). gpuscope synchronises the device after each call.
    *args, **kwargs
        Passed to *work*.
    period : int
        PC sampling period in cycles per SM, a power of two from 32 to 2**31 (:func:`gpuscope.pc_sample`). The
        stall split depends on it for some kernels (on the H100 at 2**13, contended atomics moved 33 points of
        peak (IPC_MAX) from ``lg_throttle`` to ``drain`` and ``long_scoreboard``); 2**10 is the validated default. At
        2**10 the GPU makes samples faster than CUPTI decodes them: keep *work* to a representative slice
        (up to about 50 ms of GPU time), or CUPTI's buffer fills and samples are lost (warned).
    device : int
        GPU index.
    levels : sequence of int
        Top-Down levels to compute.
    check : {"warn", "raise", "ignore"}
        What to do when a level does not sum to 100% (:func:`gpuscope.topdown`).
    pc_sampler, profiler : callable, optional
        Factories used instead of :func:`gpuscope.pc_sample` and :class:`gpuscope.Profiler` (tests).

    Returns
    -------
    xarray.Dataset
        Dim ``kernel`` (the kernels both halves saw), every Top-Down node with the names, units and attrs of
        :func:`gpuscope.topdown`, kernels named as every Dataset of the process names them; coords
        ``kernel_qualname`` (the qualified name), ``launches`` (launches per kernel in the range pass),
        ``pc_samples`` and ``samples_per_launch``; attrs of both halves, plus ``topdown_source``,
        ``fast_topdown_collection`` (how the halves were collected), ``pc_total_samples``,
        ``pc_dropped_samples``, ``pc_unattributed_samples`` (samples CUPTI could not attribute to a kernel),
        ``pc_blocks`` (2 where the first PC block's buffer filled and it ran again),
        ``pc_hardware_buffer_full`` (1: CUPTI lost samples it did not count; gpuscope warned),
        ``pc_sampling_period_cycles``, ``kernels_without_pc_samples`` and ``kernels_without_ipc`` (kernels only
        one half saw).

    Raises
    ------
    ValueError
        A bad *period*, *levels* or *check* (before any GPU work).
    FastTopDownError
        No kernel was seen by both halves; or *work* launched CUDA graphs (``cuGraphLaunch``): PC sampling needs
        CUPTI detached and the graph copies that run their nodes one by one need it attached (the message names
        the kernels PC sampling saw, and what gives the graph kernels' Top-Down instead).
    """
    from gpuscope._pc_sampling import messages as _messages
    from gpuscope._pc_sampling import sampler as _pcsampling
    from gpuscope._range_profiling.session import _capacity
    from gpuscope._schema.names import match_kernel
    from gpuscope.metrics import topdown as td

    if not callable(work):
        raise TypeError(f"work must be a callable that launches the kernels, got {type(work).__name__}")
    _pcsampling._period_log2(period)
    check = _validate.choice(check, "check", ("warn", "raise", "ignore"))
    pc_sampler = pc_sampler or _pcsampling.pc_sample
    if profiler is None:
        from gpuscope._range_profiling.session import Profiler as profiler

    # PC sampling first, while no session of gpuscope is open: the block detaches CUPTI, so that kernels profiled
    # by earlier sessions are mapped for PC sampling (it cannot detach beside an open session). Then the range pass,
    # in iteration mode (kernel replay costs 13 ms per launch), its image sized from the launches the block counted;
    # where they were not counted, a first iteration sizes it.
    pcs, blocks = _pc_block(pc_sampler, period, device, work, args, kwargs)
    graphs = int(getattr(pcs, "graph_launches", 0) or 0)
    if graphs:
        raise FastTopDownError(_graph_message(graphs, pcs.dataset))
    counted = sum((getattr(pcs, "launches", None) or {}).values())
    sizing = {"max_ranges": _capacity(counted)} if counted else {}
    with profiler(FAST_SET, mode="iteration", device=device, **sizing) as prof:
        for _ in range(prof.passes + (0 if sizing else 1)):
            prof.step()
            work(*args, **kwargs)
    pc, ranges = pcs.dataset, prof.dataset
    stalls = stall_percentages(pc)
    sampled = [str(k) for k in stalls["kernel"].values]
    rows = ranges.isel(range=[i for i, k in enumerate(ranges["kernel"].values) if str(k)])
    per_kernel = td.aggregate(rows, by="kernel")
    names = {str(k): match_kernel(str(k), sampled) for k in per_kernel["kernel"].values}
    both = {k: n for k, n in names.items() if n is not None}
    if not both:
        unattributed = int(pc.attrs.get("non_user_kernel_samples", 0))
        why = " " + _messages.unattributed_message(unattributed, int(pc.attrs.get("total_samples", 0)),
                                                   str(pc.attrs.get("cupti_detach", ""))) if unattributed else ""
        raise FastTopDownError(
            f"No kernel was seen by both PC sampling ({sampled or 'no samples'}) and the range pass "
            f"({list(names) or 'no launches'}): does work() launch kernels on device {device}, the same each "
            f"call?{why}")
    unsampled = {k: int(per_kernel["count"].sel(kernel=k)) for k in names if k not in both}
    if unsampled:
        warnings.warn(_messages.unsampled_message(unsampled, int(pc.attrs.get("non_user_kernel_samples", 0)),
                                                  int(pc.attrs.get("total_samples", 0)),
                                                  str(pc.attrs.get("cupti_detach", "")))
                      + " They are left out of the result (kernels_without_pc_samples).", GpuscopeWarning,
                      stacklevel=2)
    ipc = per_kernel.sel(kernel=list(both)).assign_coords(kernel=list(both.values()))
    ipc = ipc[[td.IPC_EXECUTED, td.IPC_ISSUED, td.THREADS_PER_INST]]
    ipc.attrs = dict(ranges.attrs)
    result = fast_topdown(pc, ipc, levels=levels, check=check)
    launches = [int(per_kernel["count"].sel(kernel=k)) for k in both]
    per_kernel_samples = pc["kernel_samples"].sum("stall_reason")
    samples = [int(per_kernel_samples.sel(kernel=n)) for n in both.values()]
    qualnames = dict(zip(pc["kernel"].values.tolist(), pc["kernel_qualname"].values.tolist())) \
        if "kernel_qualname" in pc.coords else {}
    result = result.assign_coords(
        kernel_qualname=("kernel", [str(qualnames.get(n, n)) for n in both.values()]),
        launches=("kernel", launches),
        pc_samples=("kernel", samples),
        samples_per_launch=("kernel", [s / n if n else float("nan") for s, n in zip(samples, launches)]),
    )
    result.attrs.update(
        fast_topdown_collection="work() twice: first under PC sampling (CUPTI detached first), then as the "
                                "range pass of an iteration-mode session (CUPTI gives no PC samples during a pass)"
                                + ("; the PC block ran twice: its 32 MiB hardware buffer filled the first time, "
                                   "the second had CUPTI's 512 MiB" if blocks > 1 else ""),
        pc_blocks=blocks,
        pc_total_samples=int(pc.attrs.get("total_samples", 0)),
        pc_dropped_samples=int(pc.attrs.get("dropped_samples", 0)),
        pc_unattributed_samples=int(pc.attrs.get("non_user_kernel_samples", 0)),
        pc_hardware_buffer_full=int(pc.attrs.get("hardware_buffer_full", 0)),
        pc_sampling_period_cycles=int(pc.attrs.get("sampling_period_cycles", period)),
        kernels_without_pc_samples=sorted(unsampled),
        kernels_without_ipc=sorted(set(sampled) - set(both.values())),
    )
    return result


def _pc_block(pc_sampler, period: int, device: int, work, args, kwargs):
    """The PC block around *work*: with a :data:`FIRST_BUFFER` hardware buffer, and again with CUPTI's 512 MiB if
    that one filled (its samples would lean toward the kernels that ran first). Returns the block and how many ran;
    the warnings of a block that ran again are not shown."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pc_sampler(period=period, device=device, hardware_buffer_size=FIRST_BUFFER) as pcs:
            work(*args, **kwargs)
    ds = getattr(pcs, "dataset", None)
    if ds is None or not int(ds.attrs.get("hardware_buffer_full", 0)):
        for w in said:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        return pcs, 1
    with pc_sampler(period=period, device=device) as pcs:
        work(*args, **kwargs)
    return pcs, 2


def _graph_message(graphs: int, pc) -> str:
    """Why fast Top-Down stops when *work* launched CUDA graphs, and what gives the graph's kernels instead."""
    from gpuscope._results.report_inputs import graph_launches_text

    sampled = [str(k) for k in pc["kernel"].values] if pc is not None and "kernel" in pc.coords else []
    seen = (f"this call's PC sampling saw {', '.join(sampled[:6])}{' and more' if len(sampled) > 6 else ''}"
            if sampled else "this call's PC sampling saw no kernel")
    return (f"work() launched {graph_launches_text(graphs)} (cuGraphLaunch: JAX's steps, "
            "torch.cuda.CUDAGraph.replay, torch.compile mode='reduce-overhead', CuPy graphs). Fast Top-Down cannot "
            "take them: its PC-sampling half needs CUPTI detached from the process, and running a graph's kernel "
            "nodes one by one in its range half needs gpuscope's copies of the graphs, made while CUPTI is attached "
            "(gpuscope.watch_graphs()); with both, PC sampling attributes none of the kernels. The Top-Down of each "
            "graph kernel node is in gpuscope.Profiler('topdown', mode='kernel' or 'auto') with "
            "gpuscope.watch_graphs() before the graphs are made (docs/graphs.md); the stall reasons of each graph "
            f"kernel in gpuscope.pc_sample() around the same work ({seen}).")
