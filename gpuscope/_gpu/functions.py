"""What the driver knows of a kernel function: its registers per thread and its static shared memory per block.

A launch call's ``f`` is a ``CUfunction`` (a module's function: CuPy's kernels) or a ``CUkernel`` (the library API,
which the CUDA runtime and cuda.core use: Numba's, cuBLAS's and cub's kernels, on the H100 with CUDA 13):
``cuFuncGetAttribute`` answers for the first and ``CUDA_ERROR_INVALID_HANDLE`` for the second, which
``cuKernelGetAttribute`` answers for on the context's device.

Kernel, iteration and auto modes hear each launch's ``CUfunction`` handle in CUPTI's launch callbacks
(:class:`gpuscope.cupti.callbacks.Launch`). The callback keeps only the handle; when the launches' rows are built,
:class:`FunctionResources` asks the driver (``cuFuncGetAttribute`` through cuda.bindings) once per handle for
``CU_FUNC_ATTRIBUTE_NUM_REGS`` and ``CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES``, the numbers Nsight Compute shows as
``launch__registers_per_thread`` and ``launch__shared_mem_per_block_static``. A value the driver does not give is
:data:`UNKNOWN`: no handle, no cuda-bindings, or a refusal (the function's module was unloaded before the rows were
built, or the handle is not one the driver can answer for).
"""

from __future__ import annotations

import threading

__all__ = ["UNKNOWN", "FunctionResources", "function_resources"]

#: The value of a registers or shared-memory count that is not known (the range coords' fill).
UNKNOWN = -1


def function_resources(handle: int) -> tuple[int, int]:
    """(registers per thread, bytes of static shared memory per block) of the kernel function *handle* (a
    ``CUfunction`` as an integer), asked of the driver; :data:`UNKNOWN` for each value it does not give."""
    if not handle:
        return UNKNOWN, UNKNOWN
    try:
        from cuda.bindings import driver
    except ImportError:  # analysis-only installs have no cuda-bindings, and no launches to ask about
        return UNKNOWN, UNKNOWN
    attribute = driver.CUfunction_attribute
    which = (attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
    try:
        asked = [_attribute(driver, driver.cuFuncGetAttribute, w, driver.CUfunction(int(handle))) for w in which]
        if UNKNOWN in asked:  # a CUkernel (the library API: the runtime, cuda.core and so Numba, cuBLAS, cub)
            err, device = driver.cuCtxGetDevice()
            if err == driver.CUresult.CUDA_SUCCESS:
                kernel = driver.CUkernel(int(handle))
                asked = [_attribute(driver, driver.cuKernelGetAttribute, w, kernel, device) for w in which]
    except Exception:
        return UNKNOWN, UNKNOWN
    return asked[0], asked[1]


def _attribute(driver, call, which, *handle) -> int:
    """``call(which, *handle)`` (``cuFuncGetAttribute`` or ``cuKernelGetAttribute``), or :data:`UNKNOWN` where the
    driver refuses (``CUDA_ERROR_INVALID_HANDLE`` for a handle of the other kind)."""
    try:
        err, value = call(which, *handle)
    except Exception:
        return UNKNOWN
    if err != driver.CUresult.CUDA_SUCCESS:
        return UNKNOWN
    value = int(value)
    return value if value >= 0 else UNKNOWN


class FunctionResources:
    """:func:`function_resources`, asked once per handle: a session keeps one for the rows it builds.

    Calling it with a handle gives ``(registers per thread, static shared memory per block)``, :data:`UNKNOWN` for
    what the driver does not give (and for handle 0, without asking). A refusal is kept too: a module unloaded
    stays unloaded. Handles are kept for the object's life only, since the driver may give an unloaded function's
    handle to a function loaded later.

    Parameters
    ----------
    query : callable, optional
        ``query(handle) -> (registers, static shared memory)``; :func:`function_resources` by default.
    """

    def __init__(self, query=None):
        self._query = function_resources if query is None else query
        self._known: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()  # rows may be built on a launching thread (an image emptied when full)

    def __call__(self, handle: int) -> tuple[int, int]:
        handle = int(handle or 0)
        if not handle:
            return UNKNOWN, UNKNOWN
        with self._lock:
            known = self._known.get(handle)
            if known is None:
                registers, static = self._query(handle)
                known = self._known[handle] = (int(registers), int(static))
            return known
