"""The ``gpuscope`` command.

``gpuscope run``      profile an unmodified Python script (kernel mode: every launch), print the report, save it
``gpuscope show``     print the report of a saved file (range, PM or PC sampling data)
``gpuscope compare``  per-kernel differences between two saved runs, flagged where larger than run-to-run noise
``gpuscope metrics``  list, search and describe a chip's metrics, the named sets, and pass counts (works offline)
``gpuscope check``    is this machine ready: CUPTI, driver, GPU, chip, profiler support, counter permission
``gpuscope demo``     the main job: Top-Down per kernel, PM time series and phases of a built-in workload

Exit statuses (docs/errors.md): 0 ok, 1 no GPU or driver, 2 CUPTI missing or unusable, 3 counters unreadable,
profiling unsupported or the GPU busy, 4 bad input, 5 a file cannot be read or written or is not gpuscope's,
6 nothing was profiled, 130 interrupted, 141 output closed early (``| head``). ``gpuscope run`` passes the
script's own non-zero status through.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpuscope import __version__
from gpuscope.errors import (CuptiNotFoundError, CuptiNotSupportedError, CuptiPermissionError, GpuscopeError, NoGpuError,
                     NotGpuscopeDataError, ProfilerBusyError)

EXIT_OK, EXIT_NO_GPU, EXIT_NO_CUPTI, EXIT_NO_COUNTERS, EXIT_USAGE = 0, 1, 2, 3, 4
EXIT_FILE, EXIT_NOTHING_PROFILED, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 5, 6, 130, 141


def _print_table(rows, header=None, out=None):
    out = out or sys.stdout
    rows = [tuple(str(c) for c in r) for r in rows]
    if header:
        rows.insert(0, tuple(header))
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


# --------------------------------------------------------------------------------------------------------------
# gpuscope metrics
# --------------------------------------------------------------------------------------------------------------


def _metrics(args) -> int:
    from gpuscope._gpu import catalog as cat

    if args.chips:
        chips = cat.list_chips()
        print(json.dumps(chips) if args.json else "\n".join(chips))
        return EXIT_OK
    if args.support:
        from gpuscope._gpu import support as _support

        info = _support.chip_support(args.chip or cat._check_chip(None))
        print(json.dumps(info.as_dict(), indent=2) if args.json else _support.format_support(info))
        return EXIT_OK
    if args.sets and args.chip:
        return _sets_on_chip(args, cat.canonical_chip(args.chip))
    if args.sets:
        sets = cat.metric_sets()
        if args.json:
            print(json.dumps({n: {"kind": s.kind, "description": s.description, "metrics": list(s.metrics),
                                  "passes": s.passes} for n, s in sets.items()}, indent=2))
            return EXIT_OK
        for name, s in sets.items():
            print(f"{name} ({s.kind}, {len(s.metrics)} metrics): {s.description}")
            for m in s.metrics:
                print(f"    {m}")
        return EXIT_OK

    explicit = "sampling" if args.sampling else args.kind
    kind = explicit or "range"
    chip = cat.canonical_chip(args.chip) if args.chip else None
    where = lambda c: f"{c}, {'PM sampling' if kind == 'sampling' else 'range profiler'}"  # noqa: E731

    if args.passes is not None:
        if not cat.split_list(args.passes):
            raise ValueError("--passes needs metric names or metric-set names, e.g. --passes topdown,launch")
        metrics, kind = cat.expand(args.passes, explicit)  # a set's kind needs no --sampling
        chip = chip or cat._check_chip(None)
        names = cat.resolve(metrics, chip, kind)
        passes = cat.count_passes(names, chip, kind)
        per = {m: cat.count_passes([m], chip, kind) for m in names}
        from gpuscope.cupti import _api

        version = "%d.%d" % _api.version()
        if args.json:
            print(json.dumps({"chip": chip, "kind": kind, "cupti": version, "passes": passes,
                              "metrics": names, "passes_per_metric": per}, indent=2))
            return EXIT_OK
        print(f"{passes} pass{'es' if passes != 1 else ''} for {len(names)} metrics ({where(chip)}, CUPTI {version})")
        multi = {m: n for m, n in per.items() if n > 1}
        if multi:
            print("metrics that need several passes on their own:")
            _print_table(sorted(((n, m) for m, n in multi.items()), reverse=True), out=sys.stdout)
        if kind == "sampling" and passes > 1:
            print("PM sampling needs a single pass: drop metrics or split them over several runs.")
            return EXIT_USAGE
        return EXIT_OK

    if args.describe:
        infos = [cat.describe_metric(n, chip, kind) for n in cat.split_list(args.describe)]
        if args.json:
            out = []
            for i in infos:
                d = dict(i.__dict__)
                if not i.suffix:
                    d["sub_metrics"] = cat.sub_metrics(i.base, chip, kind)
                out.append(d)
            print(json.dumps(out, indent=2))
            return EXIT_OK
        for i in infos:
            print(i.name)
            print(f"  type        {i.metric_type.lower()}")
            print(f"  hw unit     {i.hw_unit}")
            if i.units:
                print(f"  units       {i.units}")
            print(f"  description {i.description}")
            if not i.suffix:
                subs = cat.sub_metrics(i.base, chip, kind)
                print(f"  complete names ({len(subs)}):")
                for s in subs:
                    print(f"    {s}")
        return EXIT_OK

    if args.search:
        infos = cat.search_metrics(args.search, chip, kind, descriptions_too=not args.names_only,
                                   internal=args.internal)
        if args.json:
            print(json.dumps([i.__dict__ for i in infos], indent=2))
            return EXIT_OK if infos else EXIT_NOTHING_PROFILED
        if not infos:
            print(f"No {kind} metric matches {args.search!r}.")
            return EXIT_NOTHING_PROFILED  # as grep: a search that finds nothing is not a success
        _print_table(
            [(i.name, i.metric_type.lower(), i.hw_unit, i.description) for i in infos],
            header=("metric", "type", "unit", "description"),
        )
        searched = "names" if args.names_only else "names and descriptions"
        print(f"\n{len(infos)} base metrics ({searched} searched). Complete a name with a "
              "sub-metric: gpuscope metrics --describe <name>")
        return EXIT_OK

    names = cat.list_metrics(chip, kind, args.type, full=args.full, internal=args.internal)
    print(json.dumps(names) if args.json else "\n".join(names))
    return EXIT_OK


def _sets_on_chip(args, chip: str) -> int:
    """``gpuscope metrics --sets --chip X``: every set as the chip collects it, with what was substituted."""
    from gpuscope._gpu import catalog as _catalog
    from gpuscope._gpu import support as _support

    info = _support.chip_support(chip)
    if args.json:
        print(json.dumps({s["name"]: s for s in info.as_dict()["sets"]}, indent=2))
        return EXIT_OK
    for st in info.sets:
        if st.error:
            print(f"{st.name} ({st.kind}) on {info.chip}: unsupported: {st.error}")
            continue
        print(f"{st.name} ({st.kind}, {len(st.metrics)} metrics, {st.passes} pass{'es' if st.passes != 1 else ''} "
              f"on {info.chip}, {st.status}): {_catalog.metric_set(st.name).description}")
        for m in st.metrics:
            print(f"    {m}")
        for original, used in st.substituted.items():
            print(f"  substituted: {original} -> {', '.join(used)}")
        for original in st.left_out:
            print(f"  left out: {original} (no equivalent on {info.chip})")
    print(f"\n{info.chip} ({info.family}): " + ("verified on hardware" if info.hardware else
                                                "checked offline only (CUPTI host API), not run on this GPU"))
    return EXIT_OK


# --------------------------------------------------------------------------------------------------------------
# gpuscope check
# --------------------------------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _admin_only() -> bool | None:
    text = _read("/proc/driver/nvidia/params")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("RmProfilingAdminOnly"):
            return line.split(":", 1)[1].strip() == "1"
    return None


def _check(args) -> int:
    """Collect facts step by step; each step that fails says why and what to do, and sets the exit code."""
    # every key is present in --json output, null until checked; "missing" says what is missing and why
    report: dict = {"gpuscope": __version__, **{k: None for k in _CHECK_KEYS}, "missing": []}
    lines: list[tuple[str, str]] = [("gpuscope", __version__)]
    code = EXIT_OK

    from gpuscope.cupti import _lib

    if getattr(args, "chip", None):
        return _check_chip(args)
    try:
        lib = _lib.load()
        report["cupti"] = {"version": lib.version_string, "api_version": lib.api_version, "path": lib.path,
                           "found_via": lib.found_via}
        lines.append(("CUPTI", f"{lib.version_string} (API {lib.api_version}) at {lib.path} [{lib.found_via}]"))
    except CuptiNotFoundError as exc:
        report["cupti"] = {"error": str(exc)}
        report["missing"].append({"what": "cupti", "why": str(exc)})
        lines.append(("CUPTI", f"NOT USABLE: {exc}"))
        return _finish(args, report, lines, EXIT_NO_CUPTI)

    from gpuscope._gpu import device as _device

    cuda_version = _device.driver_version()
    driver = (_read("/sys/module/nvidia/version") or "").strip()
    if cuda_version is None:
        report["missing"].append({"what": "driver", "why": "this machine has no NVIDIA driver (libcuda.so.1 not "
                                  "found), so no GPU can be used"})
        report["offline"] = list(_OFFLINE)
        lines.append(("driver", "none: this machine has no NVIDIA driver"))
        lines.append(("GPU", "none. Offline work still works: gpuscope metrics --chip GH100, and analysis of "
                             "recorded data (gpuscope demo)"))
        return _finish(args, report, lines, EXIT_NO_GPU)
    report["driver"] = {"version": driver, "cuda": "%d.%d" % cuda_version}
    lines.append(("driver", f"{driver or 'unknown version'} (CUDA {cuda_version[0]}.{cuda_version[1]})"))

    try:
        count = _device.device_count()
        info = _device.device_info(args.device)
    except (NoGpuError, ValueError) as exc:
        report["gpu"] = {"error": str(exc)}
        report["missing"].append({"what": "gpu", "why": str(exc)})
        report["offline"] = list(_OFFLINE)
        lines.append(("GPU", f"none: {exc}"))
        return _finish(args, report, lines, EXIT_NO_GPU)
    report["gpu"] = {"count": count, **{k: v for k, v in info.__dict__.items()}}
    lines.append((f"GPU {info.index}", f"{info.name}, compute capability {info.compute_capability_str}, "
                                       f"{info.sm_count} SMs, {info.memory_bytes / 2**30:.1f} GiB "
                                       f"({count} GPU{'s' if count != 1 else ''} visible)"))

    from gpuscope.cupti import profiler
    from gpuscope.cupti._types import ProfilerApi

    ctx = _device.PrimaryContext(args.device)
    try:
        profiler.initialize()
        try:
            chip = profiler.chip_name(args.device)
            report["chip"] = chip
            lines.append(("chip", chip))
            _add_support(report, lines, chip)
            for api, label in ((ProfilerApi.RANGE_PROFILING, "range profiling"), (ProfilerApi.PM_SAMPLING,
                                                                                 "PM sampling")):
                support = profiler.device_support(int(args.device), api)
                report[label.replace(" ", "_")] = support.overall.name
                text = support.overall.name.lower()
                if not support.supported:
                    text += " (" + ", ".join(support.reasons()) + ")"
                    report["missing"].append({"what": label.replace(" ", "_"), "why": text})
                    code = code or EXIT_NO_COUNTERS
                lines.append((label, text))
            admin_only = _admin_only()
            try:
                # PM sampling's availability query, by device: the range profiler's (by context) leaves CUPTI 13.0
                # unable to deliver PC-sampling records later in the same process (seen on the H100)
                image = profiler.pm_counter_availability(int(args.device))
                readable = not (admin_only and os.geteuid() != 0)
                detail = f"PM counter-availability image {image.size} bytes"
            except PermissionError as exc:
                readable, detail = False, str(exc)
            if admin_only is not None:
                detail += f"; RmProfilingAdminOnly={int(admin_only)}"
            if not readable:
                from gpuscope.errors import COUNTER_PERMISSION_HELP

                detail += ". " + COUNTER_PERMISSION_HELP
                report["missing"].append({"what": "counters_readable", "why": detail})
                code = code or EXIT_NO_COUNTERS
            report["counters_readable"] = readable
            lines.append(("counters", ("readable" if readable else "NOT READABLE") + f" ({detail})"))
        finally:
            profiler.deinitialize()
    except GpuscopeError as exc:
        report["error"] = str(exc)
        report["missing"].append({"what": "profiler", "why": str(exc)})
        lines.append(("error", str(exc)))
        code = code or EXIT_NO_COUNTERS
    finally:
        ctx.close()
    return _finish(args, report, lines, code)


def _add_support(report: dict, lines: list, chip: str) -> None:
    """Which sets are complete and reduced on *chip*, and whether it was verified on hardware."""
    from gpuscope._gpu import support as _support

    try:
        info = _support.chip_support(chip)
    except GpuscopeError as exc:
        lines.append(("sets", f"unknown: {exc}"))
        return
    report["support"] = info.as_dict()
    by_status: dict = {}
    for st in info.sets:
        by_status.setdefault(st.status, []).append(st.name)
    lines.append(("Top-Down", f"{info.family}" + (f", IPC_MAX {info.ipc_max:g}" if info.ipc_max else "")))
    lines.append(("sets", "; ".join(f"{k}: {', '.join(v)}" for k, v in by_status.items())
                  + (f" (details: gpuscope metrics --chip {chip} --support)" if "reduced" in by_status else "")))
    lines.append(("verified", f"on hardware: {info.hardware}" if info.hardware else
                  "offline only (CUPTI host API); gpuscope was not run on this chip's hardware"))


def _check_chip(args) -> int:
    """``gpuscope check --chip X``: what gpuscope supports on a chip, offline."""
    from gpuscope._gpu import support as _support
    from gpuscope.cupti import _lib

    lib = _lib.load()
    info = _support.chip_support(args.chip)
    if args.json:
        print(json.dumps({"gpuscope": __version__, "cupti": lib.version_string, "support": info.as_dict()},
                         indent=2))
    else:
        print(f"gpuscope {__version__}, CUPTI {lib.version_string} at {lib.path}")
        print(_support.format_support(info))
    return EXIT_OK


_CHECK_KEYS = ("cupti", "driver", "gpu", "chip", "range_profiling", "pm_sampling", "counters_readable")
_OFFLINE = ("gpuscope metrics --chip GH100 (metric catalog, pass counts)",
            "gpuscope show / compare of saved files, gs.report, gs.topdown, gs.phases on recorded data",
            "gpuscope demo (analysis of the H100 recordings shipped with gpuscope)")


def _finish(args, report, lines, code) -> int:
    report["ok"] = code == EXIT_OK
    reason = report["missing"][0]["what"] if report["missing"] else ""
    # what was not checked, and why: everything after the first thing that is missing
    report["not_checked"] = {k: f"needs {reason}" for k in _CHECK_KEYS if report.get(k) is None and k != reason}
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(lines)
        print("ready to profile" if code == EXIT_OK else "NOT ready to profile (exit status %d)" % code)
    return code


# --------------------------------------------------------------------------------------------------------------


def _demo(args) -> int:
    from gpuscope._commands import demo as _demo

    return _demo.main(args.out, record_to=args.record_to, force_recorded=args.recorded)


# --------------------------------------------------------------------------------------------------------------
# gpuscope run / show / compare
# --------------------------------------------------------------------------------------------------------------


def _run(args) -> int:
    from gpuscope._gpu import catalog as _catalog
    from gpuscope._commands import run as _run

    metrics = None
    if args.metrics:
        metrics, kind = _catalog.expand(args.metrics)
        if kind != "range":
            raise ValueError(f"--set/--metrics {','.join(args.metrics)} is a PM sampling set: use "
                             f"--sample {','.join(args.metrics)}@100us to sample it over the whole run.")
    module, script_args = (args.module[0] if args.module else "", args.module[1:]) if args.module is not None else (
        None, args.args)
    opts = _run.RunOptions(
        script=args.script, module=module, args=list(script_args), metrics=metrics, mode=args.mode,
        kernels=_catalog.split_list(args.kernels) if args.kernels else None,
        exclude=_catalog.split_list(args.exclude) if args.exclude else None,
        launch_skip=args.launch_skip, launch_count=args.launch_count,
        sample=_run.parse_sample(args.sample) if args.sample else None,
        output=args.output, trace=args.trace, report=not args.no_report, device=args.device,
        kernel_times=args.kernel_times, force=args.force,
    )
    return _run.run_script(opts)


#: What a file of each kind cannot lack: a dim (range results, PM samples) or a variable (PC samples).
_KIND_NEEDS = {"range": "range", "pm_sampling": "time", "pc_sampling": "kernel_samples"}


def _open(path: str):
    """A saved gpuscope Dataset, or an error that says what the file is not."""
    from gpuscope._results.io import open_dataset
    from gpuscope._results.report_inputs import _kind

    try:
        ds = open_dataset(path)
    except (FileNotFoundError, NotGpuscopeDataError):
        raise
    except (OSError, ValueError) as exc:
        raise NotGpuscopeDataError(f"{path} is not a netCDF file that gpuscope can read ({exc}). gpuscope writes "
                                   "its results with gpuscope run -o FILE.nc or gpuscope.save_dataset.") from None
    try:
        _kind(ds)
    except NotGpuscopeDataError as exc:
        raise NotGpuscopeDataError(f"{path}: {exc}") from None
    if "device" not in ds.dims:  # a file of several devices: each device's part is checked (by _show)
        _check_dims(path, ds)
    return ds


def _check_dims(path: str, ds) -> None:
    """Raise unless *ds* has what its kind cannot lack (an edited ``kind`` made the report fail on a missing dim)."""
    from gpuscope._results.report_inputs import _kind

    kind = _kind(ds)
    need = _KIND_NEEDS[kind]
    if need not in ds.dims and need not in ds.data_vars:
        raise NotGpuscopeDataError(
            f"{path}: its kind attribute says {kind!r}, but it has no {need!r} "
            f"{'variable' if kind == 'pc_sampling' else 'dim'} (its dims: {', '.join(map(str, ds.dims)) or 'none'}): "
            "the file was edited or damaged. Save the Dataset again with gpuscope.save_dataset.")


def _no_samples(path: str, ds) -> str:
    """What show says of PM samples without a sample (a run whose samples were all lost writes one)."""
    from gpuscope._results.report_inputs import _device_line

    lost = ds.attrs.get("lost_samples")
    why = f"{lost} samples were lost during collection (attrs['lost_samples'])" if lost else "none was recorded"
    return f"gpuscope report: PM sampling, no samples ({_device_line(ds)})\n(no rows)\nnote: {path} holds no " \
           f"samples: {why}."


def _show(args) -> int:
    import pandas as pd

    from gpuscope._pm_sampling.multi import each_device
    from gpuscope._results.report import raw_text, report
    from gpuscope._schema.dataset import to_dataframe

    if args.page == "raw" and args.by:
        raise ValueError("--by groups the rows of the details page; --page raw lists every row as it was recorded")
    options = {"by": args.by} if args.by else {}
    tables = {}
    for path in args.files:
        parts = each_device(_open(path))  # a file of several devices: each device's report
        for part in parts:
            _check_dims(path, part)
            if len(parts) > 1:
                print(f"device {part.attrs['device_index']}:")
            if part.attrs.get("kind") == "pm_sampling" and part.sizes.get("time") == 0:
                print(_no_samples(path, part))
            elif args.page == "raw":
                print(raw_text(part))
                tables[(path, part.attrs.get("device_index", 0))] = to_dataframe(part)
            else:
                table = report(part, **options)
                print(table)
                tables[(path, part.attrs.get("device_index", 0))] = pd.DataFrame(table).reset_index()
    if args.csv and tables:  # one table: with several files or devices, each row says which
        frame = next(iter(tables.values())) if len(tables) == 1 else (
            pd.concat(tables, names=["file", "device"]).reset_index(level=[0, 1]))
        frame.to_csv(args.csv, index=False)
    return EXIT_OK


def _compare(args) -> int:
    import warnings

    from gpuscope._results.compare import compare
    from gpuscope.errors import GpuscopeWarning

    base, new = _open(args.base), _open(args.new)
    with warnings.catch_warnings():  # the coverage warnings of Top-Down repeat for each file; compare says enough
        warnings.simplefilter("ignore", GpuscopeWarning)
        result = compare(base, new, alpha=args.alpha, min_change=args.min_change)
    if args.all:
        print(result.to_text(all_rows=True))
    else:
        print(result)
    if args.csv:
        result.to_csv(args.csv)
    return EXIT_OK


# --------------------------------------------------------------------------------------------------------------


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
                     epilog="Exit statuses: 0 ok, 1 no GPU, 2 no CUPTI, 3 counters unavailable, 4 bad input, "
                            "5 file problem, 6 nothing profiled (docs/errors.md).")
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
    r.add_argument("-k", "--kernels", "--kernel-name", dest="kernels", action="append", metavar="NAMES",
                   help="profile only these kernels: names (demangled, or parts of symbols) or regex:PATTERN, "
                        "comma-separated or repeated (a regex: entry is never split at its commas)")
    r.add_argument("--exclude", action="append", metavar="NAMES", help="never profile these kernels (same forms)")
    r.add_argument("-s", "--launch-skip", type=_counts, metavar="N", help="skip the first N matching launches")
    r.add_argument("-c", "--launch-count", type=_counts, metavar="N", help="profile at most N matching launches")
    r.add_argument("-o", "--output", metavar="FILE.nc", help="save the results (also when the script fails)")
    r.add_argument("-f", "--force", action="store_true", help="overwrite the -o and --trace files if they exist")
    r.add_argument("--trace", metavar="FILE.json", help="also write a Perfetto/Chrome trace of the results")
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
    s.add_argument("--page", choices=("details", "raw"), default="details",
                   help="details (default): the report, fitted to the terminal; raw: every value of every row with "
                        "its unit")
    s.add_argument("--csv", metavar="FILE", help="also write the whole table as CSV: every column of the report, or "
                                                 "with --page raw every value (gpuscope.to_dataframe)")
    s.set_defaults(func=_show)

    c = sub.add_parser("compare", help="per-kernel differences between two saved runs, with their significance",
                       description="Compares each kernel's launches in BASE and NEW (Welch t-test) and flags "
                                   "differences larger than run-to-run noise.")
    c.add_argument("base", metavar="BASE.nc")
    c.add_argument("new", metavar="NEW.nc")
    c.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    c.add_argument("--min-change", type=float, default=0.02,
                   help="smallest change flagged: relative for times and metrics, fraction of peak for Top-Down "
                        "nodes (default 0.02)")
    c.add_argument("--all", action="store_true", help="print every row, not only time and significant ones")
    c.add_argument("--csv", metavar="FILE", help="also write every row as CSV")
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


def exit_status(exc: BaseException) -> int:
    """The documented exit status for an error that reached the command line (docs/errors.md)."""
    if isinstance(exc, CuptiNotFoundError):
        return EXIT_NO_CUPTI
    if isinstance(exc, NoGpuError):
        return EXIT_NO_GPU
    if isinstance(exc, (CuptiPermissionError, ProfilerBusyError, CuptiNotSupportedError)):
        return EXIT_NO_COUNTERS
    if isinstance(exc, (NotGpuscopeDataError, OSError)):
        return EXIT_FILE
    return EXIT_USAGE


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
