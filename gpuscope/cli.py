"""The ``gpuscope`` command.

``gpuscope run``      profile an unmodified Python script (kernel mode: every launch), print the report, save it
``gpuscope show``     print the report of a saved file (range, PM or PC sampling data), or its details page
``gpuscope compare``  per-kernel differences between two saved runs, flagged where larger than run-to-run noise
``gpuscope metrics``  list, search and describe a chip's metrics, the named sets, and pass counts (works offline)
``gpuscope check``    is this machine ready: CUPTI, driver, GPU, chip, profiler support, counter permission
``gpuscope demo``     the main job: Top-Down per kernel, PM time series and phases of a built-in workload

Exit statuses (docs/errors.md): 0 ok, 1 no GPU or driver, 2 CUPTI missing or unusable, 3 counters unreadable,
profiling unsupported or the GPU busy, 4 bad input, 5 a file cannot be read or written or is not gpuscope's,
6 nothing was profiled, 130 interrupted, 141 output closed early (``| head``). ``gpuscope run`` passes the
script's own non-zero status through.

This module parses the command line and runs the subcommand; the subcommands are in :mod:`gpuscope._commands`
(``run``, ``show``, ``compare``, ``metrics``, ``check``, ``demo``), the exit statuses in
:mod:`gpuscope._commands.exits`.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuscope import __version__
from gpuscope._commands.check import _check
from gpuscope._commands.compare import _compare

# the exit statuses, readable as cli.EXIT_* as before
from gpuscope._commands.exits import (  # noqa: F401
    EXIT_BROKEN_PIPE,
    EXIT_CHANGED,
    EXIT_FILE,
    EXIT_INTERRUPTED,
    EXIT_NO_COUNTERS,
    EXIT_NO_CUPTI,
    EXIT_NO_GPU,
    EXIT_NOTHING_PROFILED,
    EXIT_OK,
    EXIT_USAGE,
    exit_status,
)
from gpuscope._commands.metrics import _metrics
from gpuscope._commands.show import _show
from gpuscope.errors import GpuscopeError


def _demo(args) -> int:
    from gpuscope._commands import demo as _demo

    return _demo.main(args.out, record_to=args.record_to, force_recorded=args.recorded)


def _run(args) -> int:
    from gpuscope._commands import run as _run
    from gpuscope._gpu import metric_lists as _lists

    metrics = None
    if args.metrics:
        metrics, kind = _lists.expand(args.metrics)
        if kind != "range":
            raise ValueError(f"--set/--metrics {','.join(args.metrics)} is a PM sampling set: use "
                             f"--sample {','.join(args.metrics)}@100us to sample it over the whole run.")
    module, script_args = (args.module[0] if args.module else "", args.module[1:]) if args.module is not None else (
        None, args.args)
    opts = _run.RunOptions(
        script=args.script, module=module, args=list(script_args), metrics=metrics, mode=args.mode,
        kernels=_lists.split_list(args.kernels) if args.kernels else None,
        exclude=_lists.split_list(args.exclude) if args.exclude else None,
        launch_skip=args.launch_skip, launch_count=args.launch_count,
        sample=_run.parse_sample(args.sample) if args.sample else None,
        output=args.output, trace=args.trace, html=args.html, report=not args.no_report, device=args.device,
        kernel_times=args.kernel_times, force=args.force,
        nvtx=args.nvtx, nvtx_include=args.nvtx_include, nvtx_exclude=args.nvtx_exclude,
        pass_groups=None if args.pass_groups == "plan" else args.pass_groups,
        graphs=None if args.graph_profiling == "node" else args.graph_profiling,
    )
    return _run.run_script(opts)


class _Parser(argparse.ArgumentParser):
    """argparse with gpuscope's exit status for bad usage (4), not argparse's 2 (which means "no CUPTI" here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _counts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _devices(text: str):
    """``--device``: an index, a comma-separated list of them (a list even of one: ``0,``) or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    parts = [p.strip() for p in text.split(",")]
    try:
        indices = [int(p) for p in parts if p]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU index, a comma-separated list of them (0,1) or "
                                         "'all'") from None
    if not indices:
        raise argparse.ArgumentTypeError(f"{text!r} names no GPU; give an index, a list (0,1) or 'all'")
    return indices if "," in text else indices[0]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuscope", description="In-process NVIDIA GPU profiling for Python.",
                     epilog=f"Exit statuses: {EXIT_OK} ok, {EXIT_NO_GPU} no GPU or driver, {EXIT_NO_CUPTI} no CUPTI, "
                            f"{EXIT_NO_COUNTERS} counters unavailable or busy, {EXIT_USAGE} bad input, {EXIT_FILE} "
                            f"file problem, {EXIT_NOTHING_PROFILED} nothing profiled, {EXIT_CHANGED} compare "
                            f"--fail-on found a difference beyond noise, {EXIT_INTERRUPTED} interrupted, "
                            f"{EXIT_BROKEN_PIPE} output closed early (docs/errors.md). run passes the script's own "
                            "status through.")
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser(
        "run", help="profile a Python script (or -m module): report per kernel at exit, -o to save",
        usage="gpuscope run [options] script.py [args ...]\n       gpuscope run [options] -m module [args ...]",
        description="Runs SCRIPT as __main__ with ARGS in this process, as python does (-m MODULE: as python -m "
                    "does), profiling every kernel launch with the topdown set by default, and prints the report "
                    "when it ends. The script's exit status passes through. Options go before the script (or -m); "
                    "everything after it is the script's.",
    )
    what = r.add_mutually_exclusive_group()
    what.add_argument("--set", "--metrics", dest="metrics", action="append", metavar="NAMES",
                      help="metric sets and/or metric names, comma-separated (default: topdown)")
    what.add_argument("--sample", metavar="SET@INTERVAL",
                      help="PM sampling over the whole run instead, e.g. pm-default@100us (no range profiling)")
    r.add_argument("--kernel-times", action="store_true",
                   help="with --sample: also record each kernel's start and end on the GPU (CUPTI activity), for "
                        "Top-Down per phase and the trace")
    r.add_argument("--mode", choices=("kernel", "user", "iteration", "auto"), default="auto",
                   help="auto (default): iteration replay over the script's top-level gpuscope.range, or over the "
                        "loop found in its launch stream, kernel replay elsewhere; kernel: every launch replayed; "
                        "user: gpuscope.range blocks and decorated kernels")
    r.add_argument("--pass-groups", choices=("plan", "ncu", "cupti"), default="plan",
                   help="how the passes are laid out for warp-stall shares: plan (default): each share's counters in "
                        "one pass; ncu: Nsight Compute's own layout (GH100), to compare with ncu launch by launch; "
                        "cupti: CUPTI's schedule")
    r.add_argument("--graph-profiling", choices=("node", "graph"), default="node",
                   help="CUDA graph launches (JAX steps, torch.cuda.CUDAGraph, reduce-overhead): node (default): each "
                        "kernel node a row, as ncu --graph-profiling node; graph: each graph launch one row")
    r.add_argument("-k", "--kernels", "--kernel-name", dest="kernels", action="append", metavar="NAMES",
                   help="profile only these kernels: names (demangled, or parts of symbols) or regex:PATTERN, "
                        "comma-separated or repeated (a regex: entry is never split at its commas)")
    r.add_argument("--exclude", action="append", metavar="NAMES", help="never profile these kernels (same forms)")
    r.add_argument("-s", "--launch-skip", type=_counts, metavar="N", help="skip the first N matching launches")
    r.add_argument("-c", "--launch-count", type=_counts, metavar="N", help="profile at most N matching launches")
    r.add_argument("--nvtx", action="store_true",
                   help="take the script's NVTX ranges (torch.cuda.nvtx, nvtx.annotate) as gpuscope.range blocks: "
                        "NVTX is routed to CUPTI before the script starts")
    r.add_argument("--nvtx-include", action="append", metavar="PATTERN",
                   help="take only NVTX ranges matching [domain@]glob of their NVTX path (step, */forward, "
                        "NVTX@step), and those nested in them; repeatable; implies --nvtx")
    r.add_argument("--nvtx-exclude", action="append", metavar="PATTERN",
                   help="never take NVTX ranges matching this pattern, nor those nested in them; repeatable; "
                        "implies --nvtx")
    r.add_argument("-o", "--output", metavar="FILE.nc", help="save the results (also when the script fails)")
    r.add_argument("-f", "--force", action="store_true",
                   help="overwrite the -o, --trace and --html files if they exist")
    r.add_argument("--trace", metavar="FILE.json", help="also write a Perfetto/Chrome trace of the results")
    r.add_argument("--html", metavar="FILE.html",
                   help="also write the report as one self-contained HTML page (the html extra: pip install "
                        "'gpuscope[html]')")
    r.add_argument("--no-report", action="store_true", help="do not print the report")
    r.add_argument("--device", type=_devices, default=0, metavar="N|N,M|all",
                   help="GPU index (default 0); with --sample also a comma-separated list or 'all': every device "
                        "sampled at once, one Dataset with a device dim")
    r.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                   help="run a module as python -m does (its file as argv[0], the current folder first on sys.path, "
                        "a package's __main__); the last option: what follows is the module's own arguments")
    r.add_argument("script", nargs="?", help="the Python script")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    r.set_defaults(func=_run)

    s = sub.add_parser("show", help="print the report of saved results (range, PM or PC sampling)")
    s.add_argument("files", nargs="+", metavar="FILE.nc")
    s.add_argument("--by", help="group by this coordinate (range data) or by 'range' / 'phase' (PM data)")
    s.add_argument("--page", choices=("summary", "details", "raw"), default="summary",
                   help="summary (default): the report, one row per kernel, fitted to the terminal; details: per "
                        "kernel, speed of light (roofline), memory workload, occupancy and instructions as far as "
                        "the file's metrics allow (range results); raw: every value of every row with its unit")
    s.add_argument("--csv", metavar="FILE", help="also write the whole table as CSV: every column of the report, its "
                                                 "unit in the header; with --page details one row per kernel, "
                                                 "section and quantity with its unit; with --page raw every value "
                                                 "with its unit (gpuscope.to_dataframe)")
    s.add_argument("-f", "--force", action="store_true", help="replace the --csv and --html files if they exist")
    s.add_argument("--html", metavar="FILE.html",
                   help="also write the report as one self-contained HTML page (sortable tables, the Top-Down, the "
                        "details sections, the PM timeline or the source lines; opens offline): one FILE; needs "
                        "the html extra")
    s.set_defaults(func=_show)

    c = sub.add_parser("compare", help="per-kernel differences between two saved runs, with their significance",
                       description="Compares each kernel's launches in BASE and NEW (Welch t-test) and flags "
                                   "differences larger than run-to-run noise.")
    c.add_argument("base", metavar="BASE.nc")
    c.add_argument("new", metavar="NEW.nc")
    c.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    c.add_argument("--min-change", type=float, default=0.02,
                   help="smallest change flagged, as a fraction: of the base for times, metrics and rates, points "
                        "for Top-Down nodes and speed-of-light percentages (default 0.02: 2%% of the base, 2 points)")
    c.add_argument("--all", action="store_true", help="print every row, not only time and significant ones")
    c.add_argument("--csv", metavar="FILE", help="also write every row as CSV (each row's unit in its unit column)")
    c.add_argument("-f", "--force", action="store_true", help="replace the --csv and --html files if they exist")
    c.add_argument("--html", metavar="FILE.html",
                   help="also write the comparison as one self-contained HTML page (needs the html extra)")
    c.add_argument("--fail-on", choices=("slower", "change"),
                   help="exit with status 7 when a kernel's GPU time per launch went up beyond noise (slower) or "
                        "when any row changed beyond noise (change); for CI gates (default: status 0)")
    c.set_defaults(func=_compare)

    m = sub.add_parser(
        "metrics",
        help="list, search and describe metrics; pass counts (works without a GPU)",
        description="Without an action, lists the base metric names of the chip.",
    )
    m.add_argument("--chip", help="chip (GH100) or product (h100, A100, l4), any case (default: the chip of GPU 0)")
    m.add_argument("--kind", choices=("range", "sampling"), default=None,
                   help="range profiler (default) or PM sampling metrics; a set's own kind is used for --passes")
    m.add_argument("--sampling", action="store_true", help="same as --kind sampling")
    m.add_argument("--type", choices=("counter", "ratio", "throughput"), help="only base metrics of this type")
    m.add_argument("--full", action="store_true", help="list complete names (base + every sub-metric)")
    m.add_argument("--internal", action="store_true", help="include CUPTI's internal-only names (*TriageCompute*)")
    m.add_argument("--names-only", action="store_true",
                   help="--search names only (the first search of descriptions reads them from CUPTI, ~10 s)")
    action = m.add_mutually_exclusive_group()
    action.add_argument("--search", metavar="PATTERN", help="substring or glob of metric names and descriptions")
    action.add_argument("--describe", nargs="+", metavar="METRIC", help="description, units, complete names")
    action.add_argument("--passes", nargs="*", metavar="METRICS",
                        help="pass count for metric and set names, comma-separated (e.g. topdown,launch)")
    action.add_argument("--sets", action="store_true",
                        help="the named metric sets; with --chip, as that chip collects them")
    action.add_argument("--chips", action="store_true", help="chips the loaded CUPTI supports")
    action.add_argument("--support", action="store_true",
                        help="the chip's Top-Down table, each set as it collects it (complete, reduced: what was "
                             "substituted or left out), and whether it was verified on hardware")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.set_defaults(func=_metrics)

    c = sub.add_parser("check", help="is this machine ready to profile? (exit status 0 if so)")
    c.add_argument("--device", type=int, default=0, help="GPU index (default 0)")
    c.add_argument("--chip", help="no GPU needed: what gpuscope supports on this chip (GB202, rtx 5090, ...)")
    c.add_argument("--json", action="store_true", help="machine-readable output, every key present")
    c.set_defaults(func=_check)

    d = sub.add_parser(
        "demo",
        help="profile a built-in Numba workload with three phases: Top-Down per kernel, PM sampling, phases",
        description="On a machine without a GPU, runs the same analysis on H100 recordings shipped with gpuscope.",
    )
    d.add_argument("--out", default="gpuscope-demo", help="folder for the figures and netCDF files")
    d.add_argument("--recorded", action="store_true", help="analyse the shipped recordings even with a GPU")
    d.add_argument("--record-to", metavar="DIR", help="also save the new recordings (thinned) into DIR")
    d.set_defaults(func=_demo)
    return parser


def _message(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"cannot use {exc.filename}: {exc.strerror}"
    return str(exc)


def main(argv=None) -> int:
    """Run the ``gpuscope`` command; return its exit status (errors in the user's input never show a traceback)."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        if sys.stdout is not None and not sys.stdout.closed:  # gpuscope run's script may have closed it
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except BrokenPipeError:
        # `gpuscope metrics | head`: the reader is gone; say nothing more, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"gpuscope {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (GpuscopeError, KeyError, ValueError, OSError) as exc:
        print(f"gpuscope {args.command}: error: {_message(exc)}", file=sys.stderr)
        return exit_status(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
