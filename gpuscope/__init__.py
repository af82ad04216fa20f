"""gpuscope: in-process NVIDIA GPU profiling for Python research code.

Mark code with ``with gpuscope.range("step"):`` or decorate a Numba/CuPy kernel, and get xarray Datasets of
hardware metrics per launch, per named range, over time (PM sampling) and per source line (PC sampling),
analysed with the GPU Top-Down method and phase detection.

``import gpuscope`` loads neither CUDA nor CUPTI: every public name is imported from its private module on
first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from gpuscope._version import __version__


class _RegisterAccessor(importlib.abc.MetaPathFinder):
    """Registers ``ds.gpuscope`` on xarray Datasets when xarray is imported: ``import gpuscope`` does not import
    xarray itself (0.45-0.8 s, paid by every ``gpuscope run`` and script that only profiles until it needs it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "xarray":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            importlib.import_module("gpuscope.metrics.accessor")

        spec.loader.exec_module = exec_module
        return spec


if "xarray" in sys.modules:
    from gpuscope.metrics import accessor as _accessor  # noqa: F401  (registers ds.gpuscope; no CUDA, no matplotlib)
else:
    sys.meta_path.insert(0, _RegisterAccessor())

# public name -> module that defines it (imported lazily, PEP 562)
_EXPORTS = {
    # errors
    "GpuscopeError": "gpuscope.errors",
    "GpuscopeWarning": "gpuscope.errors",
    "CuptiError": "gpuscope.errors",
    "CuptiNotFoundError": "gpuscope.errors",
    "CuptiPermissionError": "gpuscope.errors",
    "NoGpuError": "gpuscope.errors",
    "UnknownMetricError": "gpuscope.errors",
    "UnsupportedChipError": "gpuscope.errors",
    "ProfilerBusyError": "gpuscope.errors",
    # metric catalog
    "list_metrics": "gpuscope._gpu.catalog",
    "search_metrics": "gpuscope._gpu.catalog",
    "describe_metric": "gpuscope._gpu.catalog",
    "count_passes": "gpuscope._gpu.metric_lists",
    "list_chips": "gpuscope._gpu.chips",
    "metric_sets": "gpuscope._gpu.metric_lists",
    "metric_set": "gpuscope._gpu.metric_lists",
    "MetricInfo": "gpuscope._gpu.catalog",
    "MetricSet": "gpuscope.metrics.catalog",
    # analysis (pure, no GPU)
    "topdown": "gpuscope.metrics.topdown",
    "aggregate": "gpuscope.metrics.topdown_aggregate",
    "dynamic": "gpuscope.metrics.phase_topdown",
    "required_metrics": "gpuscope.metrics.topdown",
    "phases": "gpuscope.metrics.phases",
    "roofline": "gpuscope.metrics.roofline",
    "memory_workload": "gpuscope.metrics.memory_workload",
    "occupancy": "gpuscope.metrics.occupancy",
    "instruction_mix": "gpuscope.metrics.instruction_mix",
    "SMLimits": "gpuscope.metrics.occupancy",
    "MissingMetricsError": "gpuscope.errors",
    # user ranges
    "range": "gpuscope._range_profiling.ranges",
    "Profiler": "gpuscope._range_profiling.session",
    "release": "gpuscope._gpu.keep",
    "replay": "gpuscope._range_profiling.session",
    "profile": "gpuscope._range_profiling.kernels",
    "open_dataset": "gpuscope._results.io",
    "example_dataset": "gpuscope._results.examples",
    "save_dataset": "gpuscope._results.io",
    "UnbalancedRangeError": "gpuscope.errors",
    "MultiPassRangeError": "gpuscope.errors",
    "SessionConflictError": "gpuscope.errors",
    "enable_nvtx": "gpuscope._range_profiling.nvtx",
    "watch_graphs": "gpuscope._range_profiling.graph_replay",
    "NvtxUnavailableError": "gpuscope.errors",
    # PC sampling
    "pc_sample": "gpuscope._pc_sampling.sampler",
    "PCSampler": "gpuscope._pc_sampling.sampler",
    "fast_topdown": "gpuscope._pc_sampling.fast",
    "profile_fast_topdown": "gpuscope._pc_sampling.fast",
    "FastTopDownError": "gpuscope._pc_sampling.fast",
    "SamplerBusyError": "gpuscope.errors",
    # source counters (CUPTI SASS metrics) and the source view
    "source_counters": "gpuscope._pc_sampling.counters",
    "SourceCounters": "gpuscope._pc_sampling.counters",
    "source": "gpuscope.metrics.source",
    "profile_source": "gpuscope._pc_sampling.source_profile",
    # PM sampling
    "sample": "gpuscope._pm_sampling.api",
    "Sampler": "gpuscope._pm_sampling.sampler",
    "MultiSampler": "gpuscope._pm_sampling.multi",
    "combine_devices": "gpuscope._pm_sampling.multi",
    "select_device": "gpuscope._pm_sampling.multi",
    "NotSinglePassError": "gpuscope.errors",
    "to_chrome_trace": "gpuscope._results.trace",
    "to_perfetto": "gpuscope._results.trace",
    # tables
    "to_dataframe": "gpuscope._schema.dataset",
    "spans": "gpuscope._schema.dataset",
    "kernel_executions": "gpuscope._schema.dataset",
    "datatree": "gpuscope._results.tree",
    "from_datatree": "gpuscope._results.tree",
    # the answer at the end of a run
    "report": "gpuscope._results.report",
    "Report": "gpuscope._results.report_table",
    "compare": "gpuscope._results.compare",
    "NotGpuscopeDataError": "gpuscope.errors",
    # many GPUs, many processes
    "rank_info": "gpuscope._results.job",
    "RankInfo": "gpuscope._results.job",
    "rank_path": "gpuscope._results.job",
    "open_ranks": "gpuscope._results.ranks",
    "merge_ranks": "gpuscope._results.ranks",
    "rank_times": "gpuscope.metrics.ranks",
    "imbalance": "gpuscope.metrics.ranks",
    "rank_topdown": "gpuscope.metrics.ranks",
    "plot_ranks": "gpuscope.metrics.ranks",
    "RankDetectionError": "gpuscope.errors",
    "RankMergeError": "gpuscope.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(__all__)
