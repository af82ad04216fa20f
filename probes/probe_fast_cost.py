"""Probe: where a warm PC-sampling block and a warm fast Top-Down spend their time, by PC sampling's device buffer.

Each case runs in a fresh process and prints one JSON object per session (stages, CUPTI calls in ms through the
shim's observer, samples, whether CUPTI's device buffer overflowed)::

    python3 probes/probe_fast_cost.py all --out fast_cost.json
    python3 probes/probe_fast_cost.py case pc:32        # one case, in this process

Cases:

``pc:<MiB>``
    Four ``gs.pc_sample(period=2**10, hardware_buffer_size=<MiB>)`` blocks around one short launch, then two
    around 40 long ones (tens of ms of GPU time): the cost of the device buffer's size, and whether a small one
    loses samples (0: CUPTI's default, 512 MiB).
``fast`` / ``fast:<MiB>``
    Four ``gs.profile_fast_topdown`` calls around one launch, and the time of each part (the PC block, the range
    session's ``with`` block, the rest: the Datasets and the Top-Down); ``<MiB>`` sets the PC block's first hardware
    buffer (:data:`gpuscope._pc_sampling.fast.FIRST_BUFFER`, 32 MiB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_session_cost import Calls  # noqa: E402

CASES = ["pc:0", "pc:128", "pc:32", "pc:8", "pc:2", "fast", "fast:8"]


def _work():
    import numpy as np
    from numba import cuda
    from workloads import fma  # benchmarks/ is on sys.path (above)

    x = cuda.to_device(np.ones(1 << 20, np.float32))

    def short():
        fma[4096, 256](x, 2000)

    def long():
        for _ in range(40):
            fma[4096, 256](x, 20000)

    for f in (short, long):
        f()
        cuda.synchronize()
    gpu = {}
    for name, f in (("short", short), ("long", long)):
        t = time.perf_counter()
        f()
        cuda.synchronize()
        gpu[name] = round(time.perf_counter() - t, 4)
    return short, long, cuda.synchronize, gpu


def case(name: str) -> list[dict]:
    import gpuscope as gs

    short, long, sync, gpu = _work()
    calls = Calls()
    out = []
    if name.startswith("pc:"):
        mib = int(name.split(":")[1])
        size = {"hardware_buffer_size": mib << 20} if mib else {}
        for i, work in enumerate([short] * 4 + [long] * 2):
            t0 = time.perf_counter()
            s = gs.pc_sample(period=2**10, **size)
            s.__enter__()
            t1 = time.perf_counter()
            work()
            sync()
            t2 = time.perf_counter()
            s.__exit__(None, None, None)
            t3 = time.perf_counter()
            ds = s.dataset
            out.append({"case": name, "session": i, "work": "short" if work is short else "long",
                        "wall_s": gpu["short" if work is short else "long"],
                        "enter_s": round(t1 - t0, 4), "body_s": round(t2 - t1, 4), "exit_s": round(t3 - t2, 4),
                        "total_s": round(t3 - t0, 4), "samples": int(ds.attrs.get("total_samples", 0)),
                        "dropped": int(ds.attrs.get("dropped_samples", 0)),
                        "buffer_full": int(ds.attrs.get("hardware_buffer_full", 0)), "calls_ms": calls.take()})
    elif name.startswith("fast"):
        from gpuscope._gpu import keep as _keep
        from gpuscope._pc_sampling import fast as _fast
        from gpuscope._range_profiling.session import Profiler

        if ":" in name:  # the PC block's first hardware buffer, in MiB
            _fast.FIRST_BUFFER = int(name.split(":")[1]) << 20
        stages = {}
        block = _fast._pc_block

        def timed_block(*a, **k):
            t = time.perf_counter()
            try:
                return block(*a, **k)
            finally:
                stages["pc_block_s"] = round(time.perf_counter() - t, 4)

        class TimedProfiler(Profiler):
            def __enter__(self):
                stages["t_range"] = time.perf_counter()
                return super().__enter__()

            def __exit__(self, *exc):
                try:
                    return super().__exit__(*exc)
                finally:
                    stages["range_session_s"] = round(time.perf_counter() - stages.pop("t_range"), 4)

        _fast._pc_block = timed_block
        for i in range(4):
            t0 = time.perf_counter()
            ds = gs.profile_fast_topdown(short, profiler=TimedProfiler)
            t1 = time.perf_counter()
            out.append({"case": name, "session": i, "total_s": round(t1 - t0, 4), **stages,
                        "rest_s": round(t1 - t0 - stages.get("pc_block_s", 0) - stages.get("range_session_s", 0),
                                        4),
                        "samples": int(ds.attrs.get("pc_total_samples", 0)), "pc_blocks": int(ds.attrs["pc_blocks"]),
                        "calls_ms": calls.take()})
        t0 = time.perf_counter()
        _keep.detach_cupti()
        out.append({"case": "detach alone", "total_s": round(time.perf_counter() - t0, 4), "calls_ms": calls.take()})
    else:
        raise SystemExit(f"unknown case {name!r}; one of {CASES}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", default=None)
    a.add_argument("--cases", default=",".join(CASES))
    c = sub.add_parser("case")
    c.add_argument("name")
    args = p.parse_args()
    if args.cmd == "case":
        for row in case(args.name):
            print(json.dumps(row), flush=True)
        return
    rows = []
    for name in args.cases.split(","):
        r = subprocess.run([sys.executable, __file__, "case", name], capture_output=True, text=True, timeout=300)
        got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode:
            got.append({"case": name, "error": r.stderr[-2000:]})
        rows += got
        for row in got:
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
