"""``@gpuscope.profile``: kernel proxies for Numba ``@cuda.jit`` dispatchers and CuPy kernels (duck-typed).

A proxy forwards everything to the kernel it wraps; only launches go through the active session on the
kernel's device, one profiled range per launch with the kernel's name, grid, block and launch index. The name is
the function's own (``fma``), as the user calls it; where two different kernels launched in one session share it,
the later one is named by as much of its qualified name as tells them apart (``helper.<locals>.fma``):

* Numba: ``kernel[grid, block](*args)`` (also ``[grid, block, stream, shared_mem]``); the launch
  configuration object is wrapped, not Numba's ``pre_launch_callbacks`` (they may not call CUDA).
* CuPy ``RawKernel``: ``kernel(grid, block, args, ...)``; ``ElementwiseKernel`` / ``ReductionKernel``:
  ``kernel(*args, ...)`` (CuPy picks grid and block; mode="kernel" records them from the driver).

With no active session a launch costs one dictionary lookup more than the bare kernel, unless the proxy was
given ``metrics``: then it opens its own session on first launch, and :attr:`KernelProxy.dataset` closes it and
returns the results.
"""

from __future__ import annotations

import functools
import threading

from gpuscope._range_profiling import session as _session
from gpuscope._schema.names import kernel_names

__all__ = ["profile", "KernelProxy"]


def profile(kernel=None, *, metrics=None, device: int = 0, **session_options):
    """Profile every launch of a Numba or CuPy kernel.

    Use bare (``@gpuscope.profile``: launches are profiled inside an active ``gpuscope.Profiler``) or with a
    metric set (``@gpuscope.profile(metrics="launch")``: the kernel gets its own session when none is active).

    Parameters
    ----------
    kernel : numba dispatcher or cupy kernel
        The kernel to wrap (when used as ``@gpuscope.profile`` without parentheses).
    metrics : str or list of str, optional
        Metric set or names for the kernel's own session.
    device : int
        The device its own session profiles.
    **session_options
        Passed to :class:`gpuscope.Profiler` for its own session (``mode``, ``max_ranges``, ...).

    Returns
    -------
    KernelProxy
        Launch it like the kernel; every other attribute is the kernel's.

    Raises
    ------
    TypeError
        *kernel* is neither a Numba dispatcher nor a CuPy kernel.
    """
    if kernel is None:
        return functools.partial(profile, metrics=metrics, device=device, **session_options)
    return KernelProxy(kernel, metrics=metrics, device=device, **session_options)


def _kind(kernel) -> str:
    if hasattr(kernel, "py_func") and hasattr(type(kernel), "__getitem__"):
        return "numba"
    cls = type(kernel)
    if cls.__module__.split(".")[0] == "cupy" or cls.__name__ in ("RawKernel", "ElementwiseKernel", "ReductionKernel"):
        return "cupy-raw" if cls.__name__ == "RawKernel" else "cupy"
    raise TypeError(
        f"gpuscope.profile wraps Numba @cuda.jit kernels and CuPy RawKernel/ElementwiseKernel/ReductionKernel, "
        f"not {cls.__module__}.{cls.__name__}. Use gpuscope.range around other code."
    )


class KernelProxy:
    """A profiled kernel: launches go through the active session; every other attribute is the kernel's."""

    def __init__(self, kernel, *, metrics=None, device: int = 0, **session_options):
        self._kind = _kind(kernel)
        self._metrics = metrics
        self._device = device
        self._options = session_options
        self._own: _session.Profiler | None = None
        self._lock = threading.Lock()
        func = getattr(kernel, "py_func", None)
        self.kernel_name = getattr(func, "__name__", None) or getattr(kernel, "name", None) or type(kernel).__name__
        # module.outer.<locals>.function, as Numba names the kernel's symbol (gpuscope._schema.names.demangle)
        self.kernel_qualname = f"{func.__module__}.{func.__qualname__}" if func is not None else self.kernel_name
        functools.update_wrapper(self, getattr(kernel, "py_func", kernel), updated=())
        self.__wrapped__ = kernel  # after update_wrapper, which points it at the Python function

    def __repr__(self):
        return f"gpuscope.profile({self.__wrapped__!r})"

    def __getattr__(self, name):
        return getattr(self.__dict__["__wrapped__"], name)

    # -- launching ---------------------------------------------------------------------------------------
    def _session(self):
        session = _session.active_session(self._device)
        if session is None and self._metrics is not None:
            with self._lock:
                if self._own is None:
                    self._own = self._open_own()
                session = self._own
        return session

    def _open_own(self) -> _session.Profiler:
        """The kernel's own session. Without an explicit mode: user ranges for a one-pass set (1.6 ms/launch on
        an H100), CUPTI kernel replay otherwise (29 ms/launch against 45 ms for per-launch user replay)."""
        options = dict(self._options)
        mode = options.pop("mode", None)
        own = _session.Profiler(self._metrics, self._device, mode=mode or "user", **options)
        if mode is None and own.passes > 1:
            own.close()
            own = _session.Profiler(self._metrics, self._device, mode="kernel", **options)
        return own.start()

    def _run(self, run, grid=None, block=None):
        session = self._session()
        if session is None:
            return run()
        return session.launch(_name(self), grid, block, run)

    def __getitem__(self, config):
        if self._kind != "numba":
            raise TypeError(f"{self.kernel_name} is a CuPy kernel: call it, do not index it.")
        launcher = self.__wrapped__[config]
        config = config if isinstance(config, tuple) else (config,)
        grid, block = config[0], config[1] if len(config) > 1 else None
        return _Launcher(self, launcher, grid, block)

    def __call__(self, *args, **kwargs):
        if self._kind == "numba":
            raise TypeError(f"Launch the Numba kernel {self.kernel_name} as kernel[grid, block](*args).")
        kernel = self.__wrapped__
        if self._kind == "cupy-raw":
            grid, block = (args[0], args[1]) if len(args) >= 2 else (kwargs.get("grid"), kwargs.get("block"))
            return self._run(lambda: kernel(*args, **kwargs), grid, block)
        return self._run(lambda: kernel(*args, **kwargs))

    # -- its own session ---------------------------------------------------------------------------------
    @property
    def dataset(self):
        """Results of the kernel's own session (``metrics=`` given): closes that session and returns its Dataset.

        Raises
        ------
        SessionConflictError
            The proxy has no session of its own (no ``metrics=``, or no launch since the last ``dataset``).
        """
        with self._lock:
            own, self._own = self._own, None
        if own is None:
            from gpuscope.errors import SessionConflictError

            raise SessionConflictError(
                f"{self.kernel_name} has no session of its own: give @gpuscope.profile(metrics=...) and launch it, "
                "or read the dataset of the gpuscope.Profiler you launched it in."
            )
        own.close()
        return own.dataset

    def close(self) -> None:
        """Close the kernel's own session, if any (its results are lost unless :attr:`dataset` was read)."""
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.close()


def _name(proxy: KernelProxy) -> str:
    """The proxy's kernel name: its own, unless another kernel of the process took it first (the process's table,
    :func:`gpuscope._schema.names.kernel_names`, that every Dataset names kernels with)."""
    return kernel_names().name(proxy.kernel_qualname, proxy.kernel_name)


class _Launcher:
    """``proxy[grid, block]``: launches through the session; other attributes are Numba's launch config's."""

    __slots__ = ("_proxy", "_launcher", "_grid", "_block")

    def __init__(self, proxy, launcher, grid, block):
        self._proxy, self._launcher, self._grid, self._block = proxy, launcher, grid, block

    def __call__(self, *args):
        launcher = self._launcher
        return self._proxy._run(lambda: launcher(*args), self._grid, self._block)

    def __getattr__(self, name):
        return getattr(self._launcher, name)
