"""Each launch row's registers per thread and static and dynamic shared memory: the driver is asked once per kernel
function and session (a stand-in for cuda.bindings' cuFuncGetAttribute: no GPU), -1 where it cannot say, and the
coords reach the Dataset, files and merged ranks, with -1 for user ranges."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import functions
from gpuscope._results import build as _results
from gpuscope._schema.dataset import RESOURCE_COORDS

NUM_REGS, SHARED_SIZE_BYTES = 4, 1  # CUfunction_attribute values (cuda.h)
SUCCESS, INVALID_HANDLE = 0, 400  # CUresult values


class StandInDriver:
    """cuda.bindings.driver as function_resources uses it: functions[handle] = (registers, static shared memory);
    a handle it does not hold is refused (CUDA_ERROR_INVALID_HANDLE, as for a function whose module was
    unloaded). ``calls`` lists (attribute, handle) per cuFuncGetAttribute."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=SUCCESS)
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_NUM_REGS=NUM_REGS,
                                           CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES=SHARED_SIZE_BYTES)

    def __init__(self, held, kernels=None):
        self.held, self.calls = dict(held), []
        self.kernels, self.kernel_calls = dict(kernels or {}), []  # CUkernel handles (the library API's)

    @staticmethod
    def CUfunction(handle):  # noqa: N802 (cuda.bindings' name)
        return ("CUfunction", handle)

    @staticmethod
    def CUkernel(handle):  # noqa: N802
        return ("CUkernel", handle)

    def cuCtxGetDevice(self):  # noqa: N802
        return SUCCESS, 0

    def cuKernelGetAttribute(self, attribute, kernel, device):  # noqa: N802
        handle = kernel[1]
        self.kernel_calls.append((attribute, handle, device))
        if handle not in self.kernels:
            return INVALID_HANDLE, 0
        registers, static = self.kernels[handle]
        return SUCCESS, registers if attribute == NUM_REGS else static

    def cuFuncGetAttribute(self, attribute, function):  # noqa: N802
        handle = function[1]
        self.calls.append((attribute, handle))
        if handle not in self.held:
            return INVALID_HANDLE, 0
        registers, static = self.held[handle]
        return SUCCESS, registers if attribute == NUM_REGS else static


@pytest.fixture
def driver(monkeypatch):
    """A stand-in driver where function_resources imports cuda.bindings' (installed or not)."""
    stand_in = StandInDriver({0xA0: (16, 0), 0xB0: (168, 1024)}, kernels={0xC0: (32, 2048)})
    monkeypatch.setitem(sys.modules, "cuda.bindings", SimpleNamespace(driver=stand_in))
    return stand_in


def test_the_driver_gives_registers_and_static_shared_memory(driver):
    assert functions.function_resources(0xB0) == (168, 1024)
    assert sorted(driver.calls) == [(SHARED_SIZE_BYTES, 0xB0), (NUM_REGS, 0xB0)]


def test_a_cukernel_is_asked_with_cukernelgetattribute(driver):
    # Numba (through cuda.core), the CUDA runtime, cuBLAS and cub launch CUkernels: cuFuncGetAttribute refuses them
    # (CUDA_ERROR_INVALID_HANDLE on the H100) and cuKernelGetAttribute answers, for the context's device
    assert functions.function_resources(0xC0) == (32, 2048)
    assert sorted(driver.kernel_calls) == [(SHARED_SIZE_BYTES, 0xC0, 0), (NUM_REGS, 0xC0, 0)]
    driver.kernel_calls.clear()
    assert functions.function_resources(0xA0) == (16, 0) and driver.kernel_calls == []  # a CUfunction: one ask


def test_an_unknown_function_or_no_handle_is_minus_one(driver):
    assert functions.function_resources(0xDEAD) == (-1, -1)  # refused: a module unloaded
    driver.calls.clear()
    assert functions.function_resources(0) == (-1, -1)
    assert driver.calls == []  # no handle: the driver is not asked


def test_a_driver_that_raises_gives_minus_one(driver, monkeypatch):
    def fail(attribute, function):
        raise RuntimeError("driver library not found")

    monkeypatch.setattr(driver, "cuFuncGetAttribute", fail)
    assert functions.function_resources(0xA0) == (-1, -1)


def test_each_function_is_asked_about_once(driver):
    known = functions.FunctionResources()
    for handle in (0xA0, 0xB0, 0xA0, 0xDEAD, 0xB0, 0xDEAD, 0):
        known(handle)
    assert known(0xA0) == (16, 0) and known(0xB0) == (168, 1024) and known(0xDEAD) == (-1, -1)
    assert sorted(h for _, h in driver.calls) == [0xA0, 0xA0, 0xB0, 0xB0, 0xDEAD, 0xDEAD]  # two attributes each
    assert functions.FunctionResources()(0xA0) == (16, 0) and len(driver.calls) == 8  # a new session asks again


def test_a_given_query_is_used():
    asked = []
    known = functions.FunctionResources(lambda handle: asked.append(handle) or (32, 44))
    assert known(7) == known(7) == (32, 44) and asked == [7]


# -- the coords in Datasets -------------------------------------------------------------------------------------

PROPS = {"gpu__time_duration.sum": {"units": "nanosecond", "description": "", "metric_type": "counter"}}


def _dataset(records):
    return _results.range_dataset(records, ["gpu__time_duration.sum"], PROPS, chip="GH100", attrs={"mode": "kernel"})


def test_user_ranges_get_minus_one_and_launch_rows_their_values(tmp_path):
    ds = _dataset([
        {"name": "step", "values": [5.0]},  # a user range: no launch
        {"name": "fma", "kernel": "fma", "launch": 0, "grid": (4096, 1, 1), "block": (256, 1, 1), "values": [1.0],
         "registers_per_thread": 40, "shared_memory_static": 44, "shared_memory_dynamic": 6144},
    ])
    for name, (dtype, fill, attrs) in RESOURCE_COORDS.items():
        assert ds[name].dims == ("range",) and ds[name].dtype == np.int64 and ds[name].attrs == attrs
        assert int(ds[name][0]) == fill == -1
    assert [int(ds[n][1]) for n in RESOURCE_COORDS] == [40, 44, 6144]
    gs.save_dataset(ds, tmp_path / "launches.nc")
    again = gs.open_dataset(tmp_path / "launches.nc")
    for name in RESOURCE_COORDS:
        assert again[name].values.tolist() == ds[name].values.tolist() and again[name].attrs["units"]


@pytest.mark.filterwarnings("ignore::gpuscope.GpuscopeWarning")  # the two stand-in ranks have no clock link
def test_merged_ranks_fill_a_rank_without_the_coords_with_minus_one():
    with_coords = _dataset([{"name": "fma", "kernel": "fma", "values": [1.0], "registers_per_thread": 40,
                             "shared_memory_static": 0, "shared_memory_dynamic": 0}])
    older = with_coords.drop_vars(list(RESOURCE_COORDS))  # a file from before gpuscope recorded them
    merged = gs.merge_ranks([with_coords.assign_attrs(rank=0), older.assign_attrs(rank=1)])
    assert merged["registers_per_thread"].dims == ("rank", "range")
    assert merged["registers_per_thread"].values.tolist() == [[40], [-1]]
