"""Record multi-phase workloads on the GPU with PM sampling, each true phase marked by a ``gpuscope.range``.

The recordings are the ground truth for phase detection (``benchmarks/bench_phases.py`` scores detectors on
them). Run on the GPU machine from the repository root::

    source tests/gpu/device_env.sh; python3 benchmarks/record_phases.py --out phases/

Each workload becomes ``<out>/<name>.nc`` (``gpuscope.save_dataset``): PM samples of ``pm-default`` every 100 us,
the true phases as the recording's spans (``gs.spans(ds)``), top-level ranges named ``<index>_<kind>``. Phase
kinds that should look alike in the sampled metrics repeat the same kind name.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

if __package__:  # imported as benchmarks.record_phases
    from benchmarks import workloads
else:  # python3 benchmarks/record_phases.py: benchmarks/ is sys.path[0]
    import workloads


def kernels():
    from numba import cuda

    work = workloads.StreamFma(16 << 20)  # stream over 3 x 64 MiB, fma over 1 Mi elements
    tiny, t = workloads.tiny, cuda.to_device(np.zeros(1024, np.float32))

    def run(kind, seconds, fma_iters=2000, sync_every=20, host_sleep=0.0):
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            if kind == "stream":
                work.stream()
            elif kind == "fma":
                work.fma(fma_iters)
            elif kind == "tiny":
                tiny[4, 256](t)
            k += 1
            if k % sync_every == 0:
                cuda.synchronize()
                if host_sleep:
                    time.sleep(host_sleep)
        cuda.synchronize()

    import cupy as cp

    m = cp.random.rand(4096, 4096, dtype=cp.float32)
    (m @ m).sum()  # cuBLAS loaded and warm before sampling

    def gemm(seconds):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(4):
                m2 = m @ m  # noqa: F841
            cp.cuda.Device().synchronize()

    def drift(seconds):
        """FMA chains that grow from 200 to 4000 iterations over *seconds*: a slow, steady change."""
        t0 = time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            work.fma(int(200 + 3800 * elapsed / seconds))
            cuda.synchronize()

    def idle(seconds):
        time.sleep(seconds)

    run("stream", 0.02)
    run("fma", 0.02)
    run("tiny", 0.02)
    return run, gemm, drift, idle


WORKLOADS = {
    # name: [(kind, seconds), ...]; kinds: stream, fma, tiny, idle, gemm, sync (stream + sync + host sleep), drift
    "idle_gaps": [("stream", 0.3), ("idle", 0.2), ("fma", 0.3), ("idle", 0.1), ("stream", 0.3)],
    "cupy_gemm": [("stream", 0.3), ("gemm", 0.4), ("fma", 0.3), ("gemm", 0.2)],
    "launch_bound": [("tiny", 0.3), ("stream", 0.3), ("tiny", 0.3), ("fma", 0.2)],
    "periodic_sync": [("sync", 0.4), ("fma", 0.3), ("sync", 0.3)],
    "slow_drift": [("stream", 0.3), ("drift", 1.0), ("stream", 0.3)],
    "lengths": [("fma", 0.2), ("stream", 0.005), ("fma", 0.02), ("stream", 0.1), ("fma", 1.0), ("stream", 0.005),
                ("fma", 0.2)],
}


def record(name, plan, run, gemm, drift, idle, interval):
    import gpuscope as gs

    with gs.sample(metrics="pm-default", interval=interval) as s:
        for i, (kind, seconds) in enumerate(plan):
            with gs.range(f"{i}_{kind}"):
                if kind == "idle":
                    idle(seconds)
                elif kind == "gemm":
                    gemm(seconds)
                elif kind == "drift":
                    drift(seconds)
                elif kind == "sync":
                    run("stream", seconds, sync_every=1, host_sleep=0.0005)
                else:
                    run(kind, seconds)
    ds = s.dataset
    ds.attrs["workload"] = name
    ds.attrs["workload_plan"] = [f"{kind}:{seconds}" for kind, seconds in plan]
    return ds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="phases")
    ap.add_argument("--interval", default="100us")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    import gpuscope as gs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fns = kernels()
    for name, plan in WORKLOADS.items():
        if args.only and name not in args.only.split(","):
            continue
        ds = record(name, plan, *fns, args.interval)
        gs.save_dataset(ds, out / f"{name}.nc")
        print(f"{name}: {ds.sizes['time']} samples, lost {ds.attrs.get('lost_samples')}, "
              f"spans {len(gs.spans(ds))}", flush=True)


if __name__ == "__main__":
    main()
