"""@gpuscope.profile plumbing with the Numba CUDA simulator and a stand-in session (no GPU)."""

import os

import numpy as np
import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
cuda = pytest.importorskip("numba.cuda")

from gpuscope._range_profiling import kernels as _kernels  # noqa: E402
from gpuscope._range_profiling import session as _session
from gpuscope._range_profiling import user as _user


@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


class FakeSession:
    def __init__(self):
        self.launches = []

    def launch(self, kernel, grid, block, run):
        self.launches.append((kernel, grid, block))
        return run()


def test_no_session_just_launches():
    k = _kernels.profile(add_one)
    x = np.zeros(16, np.float32)
    k[2, 8](x)
    assert x.tolist() == [1.0] * 16
    assert k.__name__ == "add_one" and k.py_func is add_one.py_func


def test_launch_goes_through_the_session(monkeypatch):
    fake = FakeSession()
    monkeypatch.setattr(_session, "active_session", lambda device=None: fake)
    k = _kernels.profile(add_one)
    x = np.zeros(16, np.float32)
    k[(2,), (8,)](x)
    k[1, 16](x)
    assert fake.launches == [("add_one", (2,), (8,)), ("add_one", 1, 16)]
    assert x.tolist() == [2.0] * 16
    assert _user._dim3((2,)) == (2, 1, 1) and _user._dim3(16) == (16, 1, 1)


def test_misuse_messages():
    with pytest.raises(TypeError, match="Numba @cuda.jit kernels and CuPy"):
        _kernels.profile(lambda x: x)
    with pytest.raises(TypeError, match=r"kernel\[grid, block\]"):
        _kernels.profile(add_one)(np.zeros(4))
    with pytest.raises(Exception, match="no session of its own"):
        _kernels.profile(add_one).dataset


def test_two_kernels_with_one_name_are_told_apart_and_keep_their_names_in_the_process(monkeypatch):
    @cuda.jit
    def add_one(x):  # another kernel called add_one, defined inside this function
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 10

    fake, other = FakeSession(), FakeSession()
    monkeypatch.setattr(_session, "active_session", lambda device=None: fake)
    module_level, local = _kernels.profile(globals()["add_one"]), _kernels.profile(add_one)
    here = "test_two_kernels_with_one_name_are_told_apart_and_keep_their_names_in_the_process"
    assert local.kernel_qualname.endswith(f".{here}.<locals>.add_one")
    x = np.zeros(16, np.float32)
    module_level[1, 16](x)
    local[1, 16](x)
    module_level[1, 16](x)
    assert [k for k, _, _ in fake.launches] == ["add_one", f"{here}.<locals>.add_one", "add_one"]
    monkeypatch.setattr(_session, "active_session", lambda device=None: other)
    local[1, 16](x)  # alone in another session: the name the process gave it, as in every Dataset
    assert other.launches == [(f"{here}.<locals>.add_one", 1, 16)] and x.tolist() == [22.0] * 16
