"""The Numba kernels and device arrays that the benchmarks and the GPU tests share.

A script run as ``python3 benchmarks/<name>.py`` has ``benchmarks/`` first on ``sys.path`` and imports this module
as ``workloads`` (as the other sibling imports here do); the tests, with the repository root on ``sys.path``,
import it as ``benchmarks.workloads``. A benchmark picks the name by how it was itself imported::

    if __package__:  # imported as benchmarks.<name>
        from benchmarks import workloads
    else:  # run as python3 benchmarks/<name>.py
        import workloads

so that one process holds one copy of each kernel (two copies would be two kernels of the same short name, which
gpuscope then tells apart by their module).

Kernels (``@cuda.jit``, no line info; gpuscope calls them by their names):

``stream(a, b, c)``
    ``c = a + 2 b``, one element per thread: memory-bound (two loads and a store per element).
``fma(x, n)``
    *n* dependent multiply-adds per element of *x*: compute-bound.
``tiny(x)``
    ``x += 1``: a launch that does almost nothing (launch-bound loops).
``twice(a)``
    ``a *= 2``: another small kernel, for a session around a launch or two.

:class:`StreamFma` holds their arrays and launches them with the shapes the benchmarks and tests use;
:func:`jit_as` compiles one of them again under another name (a test whose kernel names must be its own).

These stay with their scripts: ``bench_pc_sampling.py``'s ``stream`` and ``fma`` (line info, other arguments; the
PC-sampling fixtures in ``tests/fixtures/pc`` carry their module, file and line numbers); ``bench_fast_topdown.py``'s
validation kernels (line info, other arguments; PC sampling finds their cubins through their module); the line-info
FMA kernels of ``bench_session_cost.py``, ``probes/probe_session_keep.py`` and ``tests/gpu/test_session_keep.py`` (some
must be first seen by CUPTI inside a PC-sampling block, which a shared kernel cannot promise; the first two time
the import of Numba); the ``gsync`` kernels of ``probes/probe_session_keep.py`` (its cubin is the fixture
``tests/fixtures/cubins/numba_gridsync_sm90.cubin.gz``, named ``case_cubins.<locals>.gsync``) and
``bench_replay_modes.py``; the script that ``bench_session_cost.py`` runs as a user's own program (under
``python3``, ``gpuscope run`` and ``ncu``); kernels used once; and the demo's kernels (``gpuscope._commands.demo``,
shipped with the package).
"""

from __future__ import annotations

import types

import numpy as np
from numba import cuda

__all__ = ["THREADS", "blocks", "stream", "fma", "tiny", "twice", "StreamFma", "renamed", "jit_as"]

THREADS = 256


@cuda.jit
def stream(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + 2.0 * b[i]


@cuda.jit
def fma(x, n):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(n):
            v = v * 1.000001 + 0.5
        x[i] = v


@cuda.jit
def tiny(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1.0


@cuda.jit
def twice(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] *= 2.0


def blocks(size: int, threads: int = THREADS) -> int:
    """Blocks of *threads* that cover *size* elements."""
    return (size + threads - 1) // threads


class StreamFma:
    """The arrays of :func:`stream` (``a``, ``b`` -> ``c``, *n* float32 each) and :func:`fma` (``x``, ``n // 16``
    float32), ones or (``random=True``) uniform numbers of ``np.random.default_rng(0)`` drawn for ``a``, ``b``
    then ``x``. The default *n* (16 Mi) makes ``stream`` move 3 x 64 MiB, far beyond L2, and ``x`` 1 Mi elements.

    Launches use :data:`THREADS` threads per block and enough blocks to cover the array (``stream_blocks``,
    ``fma_blocks``).
    """

    def __init__(self, n: int = 16 << 20, random: bool = False):
        self.n = n
        if random:
            rng = np.random.default_rng(0)
            self.a = cuda.to_device(rng.random(n, dtype=np.float32))
            self.b = cuda.to_device(rng.random(n, dtype=np.float32))
            self.c = cuda.device_array(n, np.float32)
            self.x = cuda.to_device(rng.random(n // 16, dtype=np.float32))
        else:
            self.a = cuda.to_device(np.ones(n, np.float32))
            self.b = cuda.to_device(np.ones(n, np.float32))
            self.c = cuda.device_array(n, np.float32)
            self.x = cuda.to_device(np.ones(n // 16, np.float32))
        self.stream_blocks, self.fma_blocks = blocks(n), blocks(n // 16)

    @property
    def arrays(self):
        """``(a, b, c, x)``."""
        return self.a, self.b, self.c, self.x

    def stream(self, grid: int | None = None, kernel=None):
        """One :func:`stream` launch over the arrays (*grid* blocks: fewer cover only the start of them); *kernel*
        replaces :func:`stream` (a ``gpuscope.profile`` proxy of it, a renamed copy)."""
        kernel = stream if kernel is None else kernel
        kernel[self.stream_blocks if grid is None else grid, THREADS](self.a, self.b, self.c)

    def fma(self, iters: int, kernel=None):
        """One :func:`fma` launch over ``x``, *iters* multiply-adds per element; *kernel* replaces :func:`fma`."""
        (fma if kernel is None else kernel)[self.fma_blocks, THREADS](self.x, iters)

    def alternate(self, launches: int, iters: int = 2000, sync_every: int = 0, stream_kernel=None, fma_kernel=None):
        """*launches* launches alternating :meth:`stream` (first) and :meth:`fma` (*iters*), a synchronize after
        every *sync_every* launches (0: none) and one at the end; *stream_kernel* and *fma_kernel* replace the
        kernels."""
        for k in range(launches):
            if k % 2 == 0:
                self.stream(kernel=stream_kernel)
            else:
                self.fma(iters, kernel=fma_kernel)
            if sync_every and k % sync_every == sync_every - 1:
                cuda.synchronize()
        cuda.synchronize()


def renamed(fn, name: str):
    """*fn* under another name: Numba names a kernel after its Python function (gpuscope after its qualified name),
    so the same body compiles to a kernel of that name. Its globals stay *fn*'s."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = name
    return copy


def jit_as(name: str, kernel, **options):
    """A new dispatcher of *kernel*'s Python function named *name* (``cuda.jit(**options)``): the same source, a
    kernel of its own, compiled and loaded on its first launch.

    Its qualified name is *name* in this module, with no attribute here of that name: PC sampling cannot find its
    cubin by name, so give it to ``gpuscope.pc_sample(kernels=[...])`` (or use it for counters only).
    """
    return cuda.jit(**options)(renamed(kernel.py_func, name))
