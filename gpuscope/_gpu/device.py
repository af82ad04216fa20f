"""The GPU and its driver, through cuda.bindings (never ctypes into libcuda).

Nothing here runs at import time; the driver is initialised on the first call that needs it.
"""

from __future__ import annotations

import dataclasses
import functools
import os

from gpuscope.errors import GpuscopeError, NoGpuError, install_hint

__all__ = ["DeviceInfo", "bindings", "driver_version", "device_count", "device_info", "bus_id", "memory_used_gib",
           "process_memory_gib", "PrimaryContext"]


def bindings():
    """``cuda.bindings.driver``, imported on first use.

    Raises
    ------
    NoGpuError
        cuda-bindings is not installed (it comes with the cu13 and cu12 extras); the message says how to install it.
    """
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # collection is an extra: analysis alone needs no CUDA
        raise NoGpuError(
            f"cuda-bindings is not installed, so gpuscope cannot reach the NVIDIA driver ({exc}). Install gpuscope's "
            f"extra for your driver, cu13 (CUDA 13) or cu12 (CUDA 12): {install_hint('cu13')}."
        ) from None
    return driver


def _check(result, what: str):
    """Unpack a cuda.bindings ``(CUresult, *values)`` tuple, raising on error."""
    err, *values = result
    if int(err) != 0:
        driver = bindings()
        _, name = driver.cuGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        if name == "CUDA_ERROR_NO_DEVICE":
            raise NoGpuError(f"{what}: no NVIDIA GPU is visible to this process ({name}). Check CUDA_VISIBLE_DEVICES.")
        raise GpuscopeError(f"{what} failed: {name}")
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def _init() -> None:
    driver = bindings()
    try:
        result = driver.cuInit(0)
    except Exception as exc:  # cuda.pathfinder raises when libcuda.so.1 is missing
        raise NoGpuError(
            f"The NVIDIA driver is not available on this machine ({exc}). gpuscope can still list metrics "
            "offline (gpuscope metrics --chip GH100) and analyse recorded data."
        ) from None
    _check(result, "cuInit")


def driver_version() -> tuple[int, int] | None:
    """The CUDA version the driver supports, e.g. ``(13, 0)``, or None without a driver."""
    try:
        err, v = bindings().cuDriverGetVersion()
    except Exception:
        return None
    if int(err) != 0:
        return None
    return (v // 1000, (v % 1000) // 10)


def device_count() -> int:
    """Number of visible GPUs.

    Raises
    ------
    NoGpuError
        No driver, or no GPU visible.
    """
    _init()
    return int(_check(bindings().cuDeviceGetCount(), "cuDeviceGetCount"))


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What gpuscope records about a GPU (also written into every Dataset's attrs)."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    sm_clock_khz: int
    memory_clock_khz: int
    pci_bus_id: str
    #: The SM's resource limits by their Dataset attr names (:data:`gpuscope._schema.dataset.SM_LIMIT_ATTRS`).
    sm_limits: dict = dataclasses.field(default_factory=dict)

    @property
    def compute_capability_str(self) -> str:
        return "%d.%d" % self.compute_capability


def _device(index: int):
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(f"device={index} does not exist: this process sees {count} GPU(s) (0..{count - 1}).")
    return _check(bindings().cuDeviceGet(index), "cuDeviceGet")


def device_info(index: int = 0) -> DeviceInfo:
    """Name, compute capability, SM count, memory, clocks and SM resource limits of GPU *index*."""
    driver = bindings()
    dev = _device(index)
    attr = driver.CUdevice_attribute

    def get(a):
        return int(_check(driver.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))

    name = _check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    return DeviceInfo(
        index=index,
        name=name,
        compute_capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        memory_bytes=int(_check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
        sm_clock_khz=get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        memory_clock_khz=get(attr.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        pci_bus_id=bus_id(index),
        sm_limits={name: get(getattr(attr, enum)) for name, enum in _SM_LIMIT_ENUMS.items()},
    )


#: The device attribute behind each of :data:`gpuscope._schema.dataset.SM_LIMIT_ATTRS`.
_SM_LIMIT_ENUMS = {
    "sm_max_threads": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
    "sm_max_blocks": "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR",
    "sm_registers": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",
    "block_max_registers": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK",
    "sm_shared_memory_bytes": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "block_reserved_shared_memory_bytes": "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK",
}


@functools.cache
def bus_id(index: int = 0) -> str:
    """The PCI bus id of GPU *index* (``cuDeviceGetPCIBusId``, e.g. ``"0000:41:00.0"``): the same GPU has the same
    id in every process of the machine, whatever ``CUDA_VISIBLE_DEVICES`` numbers it (cached: a process's indices
    never change)."""
    bus = _check(bindings().cuDeviceGetPCIBusId(32, _device(index)), "cuDeviceGetPCIBusId")
    return bus.split(b"\0", 1)[0].decode() if isinstance(bus, bytes) else str(bus)


def memory_used_gib(index: int = 0) -> float:
    """Device memory in use on device *index* (every process's), in GiB (``cuMemGetInfo`` in its primary context)."""
    with PrimaryContext(index) as ctx:
        ctx.make_current()
        free, total = _check(bindings().cuMemGetInfo(), "cuMemGetInfo")
    return (int(total) - int(free)) / 2**30


def process_memory_gib(index: int = 0) -> float | None:
    """Device memory this process holds on device *index*, in GiB, from NVML (``cuda.bindings.nvml``); None where
    NVML cannot say (no NVML binding, or this process's id is not the one NVML sees, as in some containers).

    NVML is initialised at the first call of the process and left so, and each device's handle kept: the kernel-replay
    cost check asks at the close of every multi-pass kernel-mode session, which otherwise paid NVML's initialisation
    and shutdown each time (issue 52, item 14)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        bus = bus_id(index)
        handle = _nvml_handles.get(bus)
        if handle is None:
            handle = _nvml_handles[bus] = nvml.device_get_handle_by_pci_bus_id_v2(bus)
        infos = nvml.device_get_compute_running_processes_v3(handle)
        pid = os.getpid()
        for i in range(len(infos)):
            if int(infos[i].pid) == pid:
                return int(infos[i].used_gpu_memory) / 2**30
        return None
    except Exception:
        return None


_nvml_process = None  # (pid, initialised): NVML is initialised once per process (a forked child does it again)
_nvml_handles: dict[str, object] = {}  # PCI bus id -> NVML device handle, of that process


def _nvml():
    """``cuda.bindings.nvml``, initialised once per process; None where it is missing or refused to initialise."""
    global _nvml_process
    try:
        from cuda.bindings import nvml
    except ImportError:
        return None
    pid = os.getpid()
    if _nvml_process is None or _nvml_process[0] != pid:
        try:
            nvml.init_v2()
            initialised = True
        except Exception:
            initialised = False
        _nvml_process = (pid, initialised)
        _nvml_handles.clear()
    return nvml if _nvml_process[1] else None


class PrimaryContext:
    """The device's primary context (the one Numba and CuPy use), retained while open.

    ``handle`` is the ``CUcontext`` as an integer, for CUPTI calls that take ``ctx``.
    """

    def __init__(self, index: int = 0):
        self.index = index
        self._dev = _device(index)
        self._ctx = _check(bindings().cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self.handle = int(self._ctx)
        self._open = True

    def make_current(self) -> None:
        _check(bindings().cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def synchronize(self) -> None:
        """Make the context current on this thread and wait for everything launched in it to finish."""
        self.make_current()
        _check(bindings().cuCtxSynchronize(), "cuCtxSynchronize")

    def unique_id(self) -> int:
        """The context's unique id (``cuCtxGetId``): a context destroyed and made again at the same address gets
        another. The handle where the driver is older than CUDA 12.0."""
        try:
            return int(_check(bindings().cuCtxGetId(self._ctx), "cuCtxGetId"))
        except (AttributeError, GpuscopeError):
            return self.handle

    def close(self) -> None:
        """Release the retained context (safe twice)."""
        if self._open:
            self._open = False
            _check(bindings().cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
