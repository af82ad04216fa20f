"""Readable kernel names: real symbols from the H100 recordings, and C++ names checked against libstdc++."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpuscope._names import demangle

FIXTURES = Path(__file__).parents[1] / "fixtures"


def recorded_symbols():
    meta = json.loads(str(np.load(FIXTURES / "range" / "auto_3kernels_gh100.npz")["meta"]))
    launches = [launch["symbol"] for launch in meta["launches"]]
    pc = sorted(set(np.load(FIXTURES / "pc" / "pc_records.npz")["function"].tolist()))
    return launches, pc


def test_numba_symbols_of_the_recordings():
    launches, pc = recorded_symbols()
    assert [demangle(s) for s in launches] == ["__main__.stream", "__main__.fma", "__main__.inc"]
    assert [demangle(s) for s in pc] == ["benchmarks.bench_pc_sampling.fma", "benchmarks.bench_pc_sampling.stream"]


@pytest.mark.parametrize(
    "symbol,readable",
    [
        # older Numba prefixes __main__ with cudapy and has no closure tag
        ("_ZN6cudapy8__main__6kernelB2v1E5ArrayIfLi1E1C7mutable7alignedE", "__main__.kernel"),
        # a kernel defined inside a function: qualname outer.<locals>.inner, '<' and '>' escaped by Numba
        ("_ZN8__main__5outer12_3clocals_3e5innerB2v3B4cw51E5ArrayIfLi1E1C7mutable7alignedE",
         "__main__.outer.<locals>.inner"),
        ("cupy_add", "cupy_add"),  # extern "C": CuPy elementwise kernels
        ("saxpy_kernel", "saxpy_kernel"),
        ("_ZN2ns6kernelIfLi4EEEvPT_", "ns::kernel<float, 4>"),
        ("_Z6reduceIdLj256ELb1EEvPKT_PS0_m", "reduce<double, 256u, true>"),
        ("_Z3fooIN2ns3BarIiEES2_EvT_T0_", "foo<ns::Bar<int>, ns::Bar<int> >"),
        ("_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfEEEEvNT_6ParamsE", "cutlass::Kernel<cutlass::gemm::kernel::Gemm<float> >"),
        ("_Z5saxpyfPfS_", "saxpy"),
        ("_Zgarbage", "_Zgarbage"),  # not followed: unchanged, never an exception
        ("_ZN3foo", "_ZN3foo"),
    ],
)
def test_readable_names(symbol, readable):
    assert demangle(symbol) == readable


@pytest.mark.parametrize("symbol", ["_ZN2ns6kernelIfLi4EEEvPT_", "_Z6reduceIdLj256ELb1EEvPKT_PS0_m",
                                    "_Z3fooIN2ns3BarIiEES2_EvT_T0_", "_Z9my_kernelIfEvPT_",
                                    "_ZN4cuda3std3__46detail5sliceIN6thrust7complexIfEEEEvv"])
def test_cpp_names_agree_with_libstdcxx(symbol):
    from gpuscope import _source

    if _source.demangle(symbol) == symbol:
        pytest.skip("libstdc++'s __cxa_demangle is not available here")
    # libstdc++ prints "void ns::kernel<float, 4>(float*)": our name is its qualified name without type and arguments
    assert demangle(symbol) == _source.pretty_function(symbol)
