"""``gpuscope check``: is this machine ready to profile (CUPTI, driver, GPU, chip, profiler support, counters)."""

from __future__ import annotations

import json
import os

from gpuscope import __version__
from gpuscope._commands.columns import _print_table
from gpuscope._commands.exits import EXIT_NO_COUNTERS, EXIT_NO_CUPTI, EXIT_NO_GPU, EXIT_OK
from gpuscope.errors import CuptiNotFoundError, GpuscopeError, NoGpuError


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

    try:
        _device.bindings()
    except NoGpuError as exc:  # the analysis-only install: no cuda-bindings, so no driver can be reached
        report["missing"].append({"what": "cuda-bindings", "why": str(exc)})
        report["offline"] = list(_OFFLINE)
        lines.append(("driver", f"out of reach: {exc}"))
        return _finish(args, report, lines, EXIT_NO_GPU)
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
