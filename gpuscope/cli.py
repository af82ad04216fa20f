"""The ``gpuscope`` command.

``gpuscope metrics``  list, search and describe a chip's metrics, the named sets, and pass counts (works offline)
``gpuscope check``    is this machine ready: CUPTI, driver, GPU, chip, profiler support, counter permission
``gpuscope demo``     the main job: Top-Down per kernel, PM time series and phases of a built-in workload
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from .errors import CuptiNotFoundError, GpuscopeError, NoGpuError

EXIT_OK, EXIT_NO_GPU, EXIT_NO_CUPTI, EXIT_NO_COUNTERS, EXIT_USAGE = 0, 1, 2, 3, 4


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
    from . import _catalog as cat

    if args.chips:
        chips = cat.list_chips()
        print(json.dumps(chips) if args.json else "\n".join(chips))
        return EXIT_OK
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

    kind = "sampling" if args.sampling else args.kind
    chip = args.chip
    where = lambda c: f"{c}, {'PM sampling' if kind == 'sampling' else 'range profiler'}"  # noqa: E731

    if args.passes is not None:
        if not args.passes:
            raise SystemExit("--passes needs metric names or a metric-set name.")
        metrics = args.passes[0] if len(args.passes) == 1 and args.passes[0] in cat.metric_sets() else args.passes
        chip = chip or cat._check_chip(None)
        names = cat.resolve(metrics, chip, kind)
        passes = cat.count_passes(names, chip, kind)
        per = {m: cat.count_passes([m], chip, kind) for m in names}
        from .cupti import _api

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
        infos = [cat.describe_metric(n, chip, kind) for n in args.describe]
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
        infos = cat.search_metrics(args.search, chip, kind)
        if args.json:
            print(json.dumps([i.__dict__ for i in infos], indent=2))
            return EXIT_OK
        if not infos:
            print(f"No {kind} metric matches {args.search!r}.")
            return EXIT_OK
        _print_table(
            [(i.name, i.metric_type.lower(), i.hw_unit, i.description) for i in infos],
            header=("metric", "type", "unit", "description"),
        )
        print(f"\n{len(infos)} base metrics. Complete a name with a sub-metric: gpuscope metrics --describe <name>")
        return EXIT_OK

    names = cat.list_metrics(chip, kind, args.type, full=args.full)
    print(json.dumps(names) if args.json else "\n".join(names))
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
    report: dict = {"gpuscope": __version__}
    lines: list[tuple[str, str]] = [("gpuscope", __version__)]
    code = EXIT_OK

    from .cupti import _lib

    try:
        lib = _lib.load()
        report["cupti"] = {"version": lib.version_string, "api_version": lib.api_version, "path": lib.path,
                           "found_via": lib.found_via}
        lines.append(("CUPTI", f"{lib.version_string} (API {lib.api_version}) at {lib.path} [{lib.found_via}]"))
    except CuptiNotFoundError as exc:
        report["cupti"] = {"error": str(exc)}
        lines.append(("CUPTI", f"NOT USABLE: {exc}"))
        return _finish(args, report, lines, EXIT_NO_CUPTI)

    from . import _device

    cuda_version = _device.driver_version()
    driver = (_read("/sys/module/nvidia/version") or "").strip()
    if cuda_version is None:
        report["driver"] = None
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
        lines.append(("GPU", f"none: {exc}"))
        return _finish(args, report, lines, EXIT_NO_GPU)
    report["gpu"] = {"count": count, **{k: v for k, v in info.__dict__.items()}}
    lines.append((f"GPU {info.index}", f"{info.name}, compute capability {info.compute_capability_str}, "
                                       f"{info.sm_count} SMs, {info.memory_bytes / 2**30:.1f} GiB "
                                       f"({count} GPU{'s' if count != 1 else ''} visible)"))

    from .cupti import profiler
    from .cupti._types import ProfilerApi

    ctx = _device.PrimaryContext(args.device)
    try:
        profiler.initialize()
        try:
            chip = profiler.chip_name(args.device)
            report["chip"] = chip
            lines.append(("chip", chip))
            for api, label in ((ProfilerApi.RANGE_PROFILING, "range profiling"), (ProfilerApi.PM_SAMPLING,
                                                                                 "PM sampling")):
                support = profiler.device_support(int(args.device), api)
                report[label.replace(" ", "_")] = support.overall.name
                text = support.overall.name.lower()
                if not support.supported:
                    text += " (" + ", ".join(support.reasons()) + ")"
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
                from .errors import COUNTER_PERMISSION_HELP

                detail += ". " + COUNTER_PERMISSION_HELP
                code = code or EXIT_NO_COUNTERS
            report["counters_readable"] = readable
            lines.append(("counters", ("readable" if readable else "NOT READABLE") + f" ({detail})"))
        finally:
            profiler.deinitialize()
    except GpuscopeError as exc:
        report["error"] = str(exc)
        lines.append(("error", str(exc)))
        code = code or EXIT_NO_COUNTERS
    finally:
        ctx.close()
    return _finish(args, report, lines, code)


def _finish(args, report, lines, code) -> int:
    report["ok"] = code == EXIT_OK
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(lines)
        print("ready to profile" if code == EXIT_OK else "NOT ready to profile (exit status %d)" % code)
    return code


# --------------------------------------------------------------------------------------------------------------


def _demo(args) -> int:
    from . import _demo

    return _demo.main(args.out, record_to=args.record_to, force_recorded=args.recorded)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuscope", description="In-process NVIDIA GPU profiling for Python.")
    parser.add_argument("--version", action="version", version=f"gpuscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    m = sub.add_parser(
        "metrics",
        help="list, search and describe metrics; pass counts (works without a GPU)",
        description="Without an action, lists the base metric names of the chip.",
    )
    m.add_argument("--chip", help="CUPTI chip name, e.g. GH100 (default: the chip of GPU 0)")
    m.add_argument("--kind", choices=("range", "sampling"), default="range",
                   help="range profiler (default) or PM sampling metrics")
    m.add_argument("--sampling", action="store_true", help="same as --kind sampling")
    m.add_argument("--type", choices=("counter", "ratio", "throughput"), help="only base metrics of this type")
    m.add_argument("--full", action="store_true", help="list complete names (base + every sub-metric)")
    action = m.add_mutually_exclusive_group()
    action.add_argument("--search", metavar="PATTERN", help="substring or glob of base metric names")
    action.add_argument("--describe", nargs="+", metavar="METRIC", help="description, units, complete names")
    action.add_argument("--passes", nargs="*", metavar="METRIC",
                        help="pass count for metric names or one metric-set name")
    action.add_argument("--sets", action="store_true", help="the named metric sets")
    action.add_argument("--chips", action="store_true", help="chips the loaded CUPTI supports")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.set_defaults(func=_metrics)

    c = sub.add_parser("check", help="is this machine ready to profile? (exit status 0 if so)")
    c.add_argument("--device", type=int, default=0, help="GPU index (default 0)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (GpuscopeError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"gpuscope {args.command}: error: {message}", file=sys.stderr)
        return EXIT_NO_CUPTI if isinstance(exc, CuptiNotFoundError) else EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
