"""The device memory this process holds, from NVML: initialised once per process (no GPU: a stand-in NVML)."""

import os
import sys
import types
from collections import Counter
from types import SimpleNamespace

import pytest

from gpuscope._gpu import device as _device

bindings = pytest.importorskip("cuda.bindings")


class FakeNvml(types.ModuleType):
    """``cuda.bindings.nvml``'s calls that process_memory_gib makes, counted; *refuse*: init_v2 raises."""

    def __init__(self, refuse: bool = False):
        super().__init__("cuda.bindings.nvml")
        self.calls = Counter()
        self.refuse = refuse

    def init_v2(self):
        self.calls["init_v2"] += 1
        if self.refuse:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    def shutdown(self):
        self.calls["shutdown"] += 1

    def device_get_handle_by_pci_bus_id_v2(self, bus):
        self.calls["handle"] += 1
        return ("handle", bus)

    def device_get_compute_running_processes_v3(self, handle):
        self.calls["processes"] += 1
        return [SimpleNamespace(pid=os.getpid() + 1, used_gpu_memory=1 << 30),
                SimpleNamespace(pid=os.getpid(), used_gpu_memory=3 << 29)]


@pytest.fixture
def nvml(monkeypatch):
    def install(refuse=False):
        fake = FakeNvml(refuse)
        monkeypatch.setattr(bindings, "nvml", fake, raising=False)
        monkeypatch.setitem(sys.modules, "cuda.bindings.nvml", fake)
        monkeypatch.setattr(_device, "bus_id", lambda index=0: "0000:41:00.0")
        monkeypatch.setattr(_device, "_nvml_process", None, raising=False)  # a process that has not asked NVML yet
        monkeypatch.setattr(_device, "_nvml_handles", {}, raising=False)
        return fake

    return install


def test_nvml_is_initialised_once_for_every_session_that_asks(nvml):
    """Each multi-pass kernel-mode session asks at its close; it paid NVML's init and shutdown each time (issue 52,
    item 14)."""
    fake = nvml()
    assert [_device.process_memory_gib(0) for _ in range(3)] == [1.5, 1.5, 1.5]
    assert fake.calls == {"init_v2": 1, "handle": 1, "processes": 3}


def test_an_nvml_that_refuses_is_asked_once(nvml):
    fake = nvml(refuse=True)
    assert [_device.process_memory_gib(0) for _ in range(3)] == [None, None, None]
    assert fake.calls == {"init_v2": 1}
