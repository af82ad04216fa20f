"""A script that knows nothing about gpuscope: two Numba kernels and a helper, for `gpuscope run`.

    gpuscope run --set topdown -k 'regex:stream|fma' -o out.nc tutorials/report_workload.py
    gpuscope show out.nc
    gpuscope run --set topdown -k 'regex:stream|fma' -o slow.nc tutorials/report_workload.py --slow-fma
    gpuscope compare out.nc slow.nc

``stream`` is memory-bound, ``fma`` core-bound; ``scale`` runs too but is filtered out by ``-k``.
``--slow-fma`` gives the FMA chain 1.5 times the iterations (a deliberately slowed kernel for ``compare``).
"""

import argparse

import numpy as np
from numba import cuda

N = 1 << 24
BLOCK = 256


@cuda.jit
def stream(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + 2.0 * b[i]


@cuda.jit
def fma(x, iters):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iters):
            v = v * 1.000001 + 0.5
        x[i] = v


@cuda.jit
def scale(x, s):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= s


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=10, help="launches of each kernel")
    parser.add_argument("--slow-fma", action="store_true", help="1.5x the FMA iterations")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = cuda.to_device(rng.random(N, dtype=np.float32))
    b = cuda.to_device(rng.random(N, dtype=np.float32))
    c = cuda.device_array(N, np.float32)
    x = cuda.to_device(rng.random(N // 16, dtype=np.float32))
    iters = 3000 if args.slow_fma else 2000
    for _ in range(args.launches):
        stream[N // BLOCK, BLOCK](a, b, c)
        fma[N // 16 // BLOCK, BLOCK](x, iters)
        scale[N // 16 // BLOCK, BLOCK](x, 0.5)
    cuda.synchronize()
    print(f"done: c[0]={c[:1].copy_to_host()[0]:.3f}, x[0]={x[:1].copy_to_host()[0]:.3f}")


if __name__ == "__main__":
    main()
