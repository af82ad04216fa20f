"""N threads launching Numba kernels and loading new modules at once, under a gpuscope session of the mode given
(``python threads_stress.py MODE [THREADS] [LAUNCHES]``): what XLA's compiler threads do while a step runs. It must
finish; it prints one JSON line with the rows and what gpuscope counted as run unprofiled.

Each thread compiles kernels of its own while the others launch (a module load on one thread while launches run on
the others), launches on its own stream, and one thread ends in the middle of the session.
"""

import json
import sys
import threading
import time

import numpy as np
from numba import cuda

import gpuscope as gs

MODE = sys.argv[1] if len(sys.argv) > 1 else "kernel"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
LAUNCHES = int(sys.argv[3]) if len(sys.argv) > 3 else 20


def make_kernel(k: int):
    @cuda.jit
    def scale(x, out):  # each thread its own constant: a module of its own, loaded on that thread
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * (k + 1.0)

    return scale


@cuda.jit
def add(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = out[i] + x[i]


def worker(k: int, results: dict, barrier: threading.Barrier):
    stream = cuda.stream()
    x = cuda.to_device(np.arange(1 << 16, dtype=np.float32), stream=stream)
    out = cuda.device_array_like(x, stream=stream)
    barrier.wait()
    kernel = make_kernel(k)  # compiled and its module loaded while other threads launch
    for i in range(LAUNCHES if k else LAUNCHES // 2):  # thread 0 ends early
        kernel[256, 256, stream](x, out)
        add[256, 256, stream](x, out)
    stream.synchronize()
    results[k] = float(out.copy_to_host()[7])


def main():
    x = cuda.to_device(np.ones(1 << 16, dtype=np.float32))
    out = cuda.device_array_like(x)
    add[256, 256](x, out)  # Numba's context and the add kernel, before the session
    cuda.synchronize()
    t0 = time.perf_counter()
    results: dict = {}
    barrier = threading.Barrier(THREADS + 1)
    with gs.Profiler("launch", mode=MODE) as prof:
        threads = [threading.Thread(target=worker, args=(k, results, barrier)) for k in range(THREADS)]
        for t in threads:
            t.start()
        barrier.wait()
        for step in range(6):  # the main thread's own loop (iteration and auto modes follow it)
            with gs.range("step"):
                add[256, 256](x, out)
                add[256, 256](x, out)
        for t in threads:
            t.join()
        cuda.synchronize()
    ds = prof.dataset
    expected = {k: 7.0 * (k + 1.0) + 0.0 for k in range(THREADS)}
    keys = ("launches_concurrent", "launches_overlapped", "launches_before_start", "launches_other_contexts")
    print(json.dumps({"mode": MODE, "seconds": round(time.perf_counter() - t0, 2), "rows": int(ds.sizes.get("range", 0)),
                      "results_ok": all(results.get(k, -1) >= expected[k] for k in range(THREADS)),
                      **{k: int(ds.attrs.get(k, 0) or 0) for k in keys}}))


if __name__ == "__main__":
    main()
