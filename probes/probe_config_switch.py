"""Probe: may an enabled range profiler change its configuration (SetConfig with another config and counter-data
image), are its values then right, and what does each step cost against disabling and enabling a new one?

Run from the repository root on the GPU machine (about 2 minutes; each case in a fresh process under a watchdog, so
a crash is a row, not the end)::

    source tests/gpu/device_env.sh; python3 probes/probe_config_switch.py --out config_switch.json

Configurations (one 0.5 ms FMA launch each): ``kernel_td`` (Top-Down set, auto range + kernel replay, 64 ranges),
``iter_td`` (Top-Down set, auto range + user replay, one launch per pass, 16 ranges), ``user2`` (2 counters, user
range + user replay, 64 ranges), ``user2b`` (2 other counters), ``kernel2`` (``user2``'s counters, kernel replay).

Cases:

``fresh``
    Every configuration twice on a newly enabled profiler (Enable, image, SetConfig, Start, work, Stop, decode,
    evaluate, Disable): the reference values, their run-to-run difference (the yardstick), and (b) the cost of
    Disable and of each step after Enable.
``<sequence>:<how>``
    One profiler enabled once, the configurations of *sequence* one after another on it, switched *how*:
    ``switch`` (``config_switch_steps.switch``, the design tried: GetCounterDataSize, image
    initialised, SetConfig, an empty pass, SetConfig again), ``notrial`` (the same without the empty pass),
    ``naive`` (the earlier probe's way: a new image, SetConfig, the previous image freed) and ``naive_keep`` (the
    same with every image kept alive). Sequences: ``alternate`` (kernel_td, iter_td, user2, twice: the issue's
    case), ``metrics`` (user2, user2b, user2, kernel2, kernel_td, kernel2: metrics change, modes stay or change),
    ``modes`` (user2, kernel2, user2: modes change, metrics stay). After the sequence the profiler is disabled and
    a new one collects ``user2`` once (``after``): a switch that corrupted CUPTI shows there. Each session's row:
    (c) the cost of each step, CUPTI's refusal if any (and at which step), and the largest relative difference from
    the fresh values.

The table says per case and session: accepted, values right (within 3x the fresh run-to-run difference, or 2%),
milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

USER2 = ("smsp__inst_executed.sum", "sm__ctas_launched.sum")
USER2B = ("sm__cycles_elapsed.max", "smsp__warps_launched.sum")
#: name -> (metrics, range mode, replay mode, ranges)
CONFIGS = {"kernel_td": ("topdown", "auto", "kernel", 64), "iter_td": ("topdown", "auto", "user", 16),
           "user2": (USER2, "user", "user", 64), "user2b": (USER2B, "user", "user", 64),
           "kernel2": (USER2, "auto", "kernel", 64)}
SEQUENCES = {"alternate": ["kernel_td", "iter_td", "user2"] * 2,
             "metrics": ["user2", "user2b", "user2", "kernel2", "kernel_td", "kernel2"],
             "modes": ["user2", "kernel2", "user2"]}
CASES = ["fresh", "alternate:switch", "alternate:notrial", "alternate:naive", "alternate:naive_keep",
         "metrics:switch", "modes:switch", "metrics:notrial", "modes:notrial"]


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


class Setup:
    """Host objects, config images and the kernel, made once per process (as gpuscope caches them)."""

    def __init__(self):
        from probe_session_keep import kernels

        from gpuscope._gpu import device as _device
        from gpuscope._gpu import metric_lists as _lists
        from gpuscope.cupti import host, profiler
        from gpuscope.cupti._types import ProfilerRange, ProfilerType, ReplayMode

        self.launch, _, self.sync = kernels()
        self.ctx = _device.PrimaryContext(0)
        profiler.initialize()
        self.ctx.make_current()
        chip = profiler.chip_name(0)
        avail = profiler.pm_counter_availability(0)
        self.configs, self.host_ms = {}, {}
        for name, (metrics, rmode, pmode, ranges) in CONFIGS.items():
            t0 = time.perf_counter()
            names = tuple(_lists.resolve(metrics, chip, "range"))
            h = host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER, avail)
            h.add_metrics(list(names))
            cfg = h.config_image()
            self.host_ms[name] = _ms(t0)
            r = ProfilerRange.USER if rmode == "user" else ProfilerRange.AUTO
            p = ReplayMode.USER if pmode == "user" else ReplayMode.KERNEL
            self.configs[name] = (h, cfg, names, r, p, ranges, host.num_passes(cfg))

    def wanted(self, name):
        from config_switch_steps import Wanted

        _, cfg, names, r, p, ranges, _ = self.configs[name]
        return Wanted((self.ctx.handle, names, (), int(r), int(p), ranges, 1), cfg, names, int(r), int(p), ranges, 1)

    def collect(self, rp, name, image, t) -> list[float]:
        """One session's collection on a configured profiler: pass(es) around one launch, decode, evaluate."""
        from gpuscope.cupti import range_profiler
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        h, _, names, r, p, _, passes = self.configs[name]
        step = "first_start"
        t0 = time.perf_counter()
        try:
            if p == ReplayMode.KERNEL:
                rp.start(); t["first_start_ms"] = _ms(t0); step = "body"; t0 = time.perf_counter()
                self.launch(); rp.stop()
            else:
                for i in range(passes):
                    rp.start()
                    if i == 0:
                        t["first_start_ms"] = _ms(t0); step = "body"; t0 = time.perf_counter()
                    if r == ProfilerRange.USER:
                        rp.push_range("r"); self.launch(); rp.pop_range()
                    else:
                        self.launch()
                    done = rp.stop()
                assert done.all_passes_submitted, done
            self.sync()
            t["body_stop_ms"] = _ms(t0); step = "decode"; t0 = time.perf_counter()
            rp.decode()
            count = range_profiler.num_ranges(image)
            values = [float(v) for v in h.evaluate(image, 0, list(names))]
            t["decode_eval_ms"] = _ms(t0)
            t["ranges"] = count
            return values
        except Exception as exc:
            exc.step = getattr(exc, "step", step)
            raise


def fresh(s: Setup) -> dict:
    from gpuscope.cupti import range_profiler

    out = {"host_ms": s.host_ms, "sessions": []}
    for _ in range(2):
        for name in CONFIGS:
            wanted = s.wanted(name)
            t = {"config": name}
            t0 = time.perf_counter()
            rp = range_profiler.RangeProfiler(s.ctx.handle)
            t["enable_ms"] = _ms(t0); t0 = time.perf_counter()
            image = rp.counter_data_image(wanted.metrics, wanted.ranges)
            t["image_ms"] = _ms(t0); t0 = time.perf_counter()
            wanted.set_config(rp, image)
            t["setconfig_ms"] = _ms(t0)
            t["values"] = s.collect(rp, name, image, t)
            t0 = time.perf_counter()
            rp.close()
            t["disable_ms"] = _ms(t0)
            out["sessions"].append(t)
            _log(t)
    return out


def sequence(s: Setup, seq: str, how: str) -> dict:
    import numpy as np

    import config_switch_steps as configure
    from gpuscope.cupti import range_profiler

    rp = range_profiler.RangeProfiler(s.ctx.handle)
    images, held, rows = {}, [], []
    for i, name in enumerate(SEQUENCES[seq]):
        wanted = s.wanted(name)
        t = {"config": name, "session": i}
        t0 = time.perf_counter()
        try:
            if i == 0 or how in ("switch", "notrial"):
                if i == 0:
                    image = rp.counter_data_image(wanted.metrics, wanted.ranges)
                    wanted.set_config(rp, image)
                    images[wanted.key] = image
                else:
                    image = configure.switch(rp, images, wanted, trial=how == "switch")
            else:  # the earlier probe's way
                size = rp.counter_data_size(wanted.metrics, wanted.ranges)
                image = np.zeros(size, np.uint8)
                rp.initialize_counter_data(image)
                wanted.set_config(rp, image)
                if how == "naive":
                    rp._keep = {id(b): b for b in (wanted.config, image)}  # the earlier shim dropped older buffers
                else:
                    held.append(image)
            t["configure_ms"] = _ms(t0)
            t["values"] = s.collect(rp, name, image, t)
        except Exception as exc:
            t["error"] = f"{type(exc).__name__}: {exc}"[:200]
            t["step"] = getattr(exc, "step", "configure")
            rows.append(t)
            _log(t)
            break
        t["total_ms"] = _ms(t0)
        rows.append(t)
        _log(t)
    t0 = time.perf_counter()
    rp.close()
    after = {"config": "user2", "disable_ms": _ms(t0)}
    try:
        rp = range_profiler.RangeProfiler(s.ctx.handle)
        wanted = s.wanted("user2")
        image = rp.counter_data_image(wanted.metrics, wanted.ranges)
        wanted.set_config(rp, image)
        after["values"] = s.collect(rp, "user2", image, after)
        rp.close()
    except Exception as exc:
        after["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return {"sessions": rows, "after": after}


def run_case(name: str) -> dict:
    t0 = time.perf_counter()
    s = Setup()
    result = {"case": name, "setup_s": round(time.perf_counter() - t0, 3)}
    try:
        result["result"] = fresh(s) if name == "fresh" else sequence(s, *name.split(":"))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-1500:]
    return result


def _log(*what):
    print(*what, file=sys.stderr, flush=True)


def _diff(a, b) -> float:
    """The largest relative difference between two value lists (0 where both are 0)."""
    worst = 0.0
    for x, y in zip(a, b):
        scale = max(abs(x), abs(y))
        if scale > 1e-12:
            worst = max(worst, abs(x - y) / scale)
    return worst


def table(results: list[dict]) -> str:
    fresh_result = next((r["result"] for r in results if r.get("case") == "fresh" and "result" in r), {})
    fresh_rows = fresh_result.get("sessions", [])
    ref, yard = {}, {}
    for row in fresh_rows:
        if row["config"] in ref:
            yard[row["config"]] = _diff(ref[row["config"]], row["values"])
        else:
            ref[row["config"]] = row["values"]
    lines = [("| case | session | config | accepted | diff vs fresh (yardstick) | values right | configure ms | "
              "first Start ms | body+Stop ms | decode+eval ms | total ms |"), "|---" * 11 + "|"]

    def verdict(row):
        if "values" not in row or row["config"] not in ref:
            return "", ""
        d, y = _diff(ref[row["config"]], row["values"]), yard.get(row["config"], 0.0)
        return f"{d:.4f} ({y:.4f})", "yes" if d <= max(3 * y, 0.02) else "**no**"

    for r in results:
        case = r.get("case")
        if "result" not in r:
            lines.append(f"| {case} | | | crashed or failed: {r.get('error') or r.get('rc')} "
                         f"{(r.get('stderr') or '')[-160:]!r} | | | | | | | |")
            continue
        res = r["result"]
        rows = res["sessions"] + ([dict(res["after"], session="after")] if "after" in res else [])
        for row in rows:
            accepted = "yes" if "error" not in row else f"**no** at {row.get('step')}: {row['error']}"
            d, ok = verdict(row)
            conf = row.get("configure_ms", sum(row.get(k, 0) for k in ("enable_ms", "image_ms", "setconfig_ms")))
            lines.append(f"| {case} | {row.get('session', '')} | {row['config']} | {accepted} | {d} | {ok} | "
                         f"{conf:.1f} | {row.get('first_start_ms', '')} | {row.get('body_stop_ms', '')} | "
                         f"{row.get('decode_eval_ms', '')} | {row.get('total_ms', '')} |")
    disables = [row["disable_ms"] for row in fresh_rows if "disable_ms" in row]
    enables = [row["enable_ms"] for row in fresh_rows if "enable_ms" in row]
    if disables:
        lines.append(f"\nfresh: Enable {min(enables)}-{max(enables)} ms, Disable {min(disables)}-{max(disables)} ms; "
                     f"host object + config image per configuration (first time only, cached after): "
                     f"{fresh_result.get('host_ms')}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.case:
        print("RESULT " + json.dumps(run_case(args.case)))
        return
    results = []
    for name in args.cases.split(","):
        try:
            p = subprocess.run([sys.executable, __file__, "--case", name], check=False, capture_output=True, text=True,
                               timeout=args.timeout)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            res = json.loads(line[7:]) if line else {"case": name, "rc": p.returncode, "stderr": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            res = {"case": name, "error": f"timed out after {args.timeout} s"}
        results.append(res)
        print(json.dumps(res), flush=True)
    text = table(results)
    if args.out:
        Path(args.out).write_text(json.dumps({"results": results, "table": text}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
