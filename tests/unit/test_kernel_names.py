"""One name per kernel in every Dataset of a process (gpuscope._schema.names.kernel_names), from the H100
recordings: the range recording's ``__main__.stream``, ``__main__.fma``, ``__main__.inc`` (kernel replay's launch
callbacks name them) and the PC recording's ``benchmarks.bench_pc_sampling.stream`` and ``.fma``, two kernels of each
short name. Range rows, PC samples, fast Top-Down and PM kernel executions must agree on each kernel's name, whichever
collector named it first, and keep its qualified name beside it."""

import json

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._pc_sampling import fast as _fast
from gpuscope._range_profiling.filters import KernelFilter
from gpuscope._range_profiling.launches import KernelReplay
from gpuscope._range_profiling.modes import _readable
from gpuscope._results import build as _results
from gpuscope.cupti.callbacks import Launch
from gpuscope.metrics import topdown as td

from .conftest import FIXTURES
from .test_keep import FakeRP
from .test_pc_fixtures import _ncu_dataset, recorded  # noqa: F401 (fixture)

CTX = 0x1234


def _range_rows():
    """Kernel replay of the range recording's launches: each row's (kernel, qualified name), as sessions name them."""
    meta = json.loads(str(np.load(FIXTURES / "range" / "auto_3kernels_gh100.npz")["meta"]))
    replay = KernelReplay(FakeRP(), CTX, KernelFilter.build(), _readable, lambda: ("", None), lambda: 0)
    for launch in meta["launches"]:
        replay.on_exit(replay.on_enter(Launch(launch["symbol"], tuple(launch["grid"]), tuple(launch["block"]), CTX)))
    return {s.qualname: s.kernel for s in replay.selected}, [launch["symbol"] for launch in meta["launches"]]


def _pc_dataset():
    from gpuscope._pc_sampling import records as _pcrecords
    from gpuscope._pc_sampling import source as _source
    from gpuscope.cupti import pc_sampling as C

    data = np.load(FIXTURES / "pc" / "pc_records.npz")
    registry = _source.CubinRegistry()
    for name in ("stream0.cubin", "fma0.cubin"):
        registry.add(str(FIXTURES / "pc" / name))
    return _pcrecords.records_dataset(C.PCRecords.from_dict(data), data["reason_indices"],
                                      [str(n) for n in data["reason_names"]], _source.SourceMap(registry),
                                      chip="GH100", attrs={"compute_capability": "9.0"})


def _executions(symbols):
    ts = gs.open_dataset(FIXTURES.parent.parent / "gpuscope" / "data" / "demo_timeseries.nc")
    t0 = int(ts.attrs["session_start_ns"])
    records = [(s, t0 + 1000 * i, t0 + 1000 * i + 600, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, i)
               for i, s in enumerate(symbols)]
    return gs.kernel_executions(_results.with_executions(ts, {"records": records, "dropped": 0, "errors": []}))


def _pairs(names, qualnames):
    return dict(zip(np.asarray(qualnames).tolist(), np.asarray(names).tolist()))


@pytest.mark.parametrize("first", ["range", "pc"])
def test_every_collector_names_a_kernel_alike_whichever_named_it_first(first):
    if first == "range":
        rows, range_symbols = _range_rows()
        pc = _pc_dataset()
    else:
        pc = _pc_dataset()
        rows, range_symbols = _range_rows()
    named = {**rows, **_pairs(pc["kernel"], pc["kernel_qualname"])}
    # the first collector's kernels get the short names; the others' keep as much of their module as tells them apart
    short, long = ({"__main__.stream", "__main__.fma", "__main__.inc"}, "bench_pc_sampling") if first == "range" \
        else ({"benchmarks.bench_pc_sampling.stream", "benchmarks.bench_pc_sampling.fma", "__main__.inc"}, "__main__")
    assert {q for q, n in named.items() if "." not in n} == short
    assert all(n.startswith(long + ".") for q, n in named.items() if q not in short)
    assert len(set(named.values())) == len(named) == 5  # two kernels never share a name
    # each PC sample's function is its kernel's name
    assert set(pc["function"].values.tolist()) == set(pc["kernel"].values.tolist())
    # PM kernel executions name them alike, the qualified name beside
    table = _executions(range_symbols + pc["kernel_mangled_name"].values.tolist())
    assert _pairs(table["kernel"], table["kernel_qualname"]) == named


def test_fast_topdown_names_its_kernels_as_the_range_pass_and_pc_samples_do(recorded):  # noqa: F811
    """The counter Top-Down named a kernel ``v_atomic`` and the fast Top-Down ``kernels2.v_atomic`` (issue 33 item
    6): now both halves carry the process's names, and the result keeps the qualified name."""
    _, pc = recorded
    ncu = _ncu_dataset()  # named as a range session of this process names the recorded kernels
    fast = _fast.fast_topdown(pc, ncu[[td.IPC_EXECUTED, td.IPC_ISSUED, td.THREADS_PER_INST]])
    assert fast["kernel"].values.tolist() == ncu["kernel"].values.tolist() == ["fma", "stream"]
    assert pc["kernel_qualname"].values.tolist() == ["benchmarks.bench_pc_sampling.fma",
                                                     "benchmarks.bench_pc_sampling.stream"]


def test_a_forked_child_names_kernels_as_its_parent_did(monkeypatch):
    """The table's lock is made anew in a forked child (a thread of the parent may have held it), its names kept."""
    import os
    import time

    from gpuscope._schema import names

    table = names.kernel_names()
    assert table.name("a.fma") == "fma"
    table._lock.acquire()  # as if another thread held it at the fork
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, f"{names.kernel_names().name('a.fma')} {names.kernel_names().name('b.fma')}".encode())
            os._exit(0)
        deadline = time.monotonic() + 30
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:  # the child hangs on the lock
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on the names table's lock")
            time.sleep(0.01)
        assert os.read(r, 100).decode() == "fma b.fma"
    finally:
        table._lock.release()
