"""Readable kernel names: real symbols from the H100 recordings and from public library builds, checked against
c++filt; the fallback parser for machines without libstdc++; short names and their disambiguation."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpuscope._schema import names as _names
from gpuscope._pc_sampling import source as _source
from gpuscope._schema.names import KernelNames, demangle, demangled_text, short_name

FIXTURES = Path(__file__).parents[1] / "fixtures"
SAME = None  # the symbol itself

#: (symbol, what `c++filt SYMBOL` printed (GNU c++filt 2.40), the readable name), for kernels of thrust, cub,
#: cuBLAS, CUTLASS, PyTorch and Numba as their binaries name them (found in public profiles, PTX and cubins).
LIBRARY_SYMBOLS = [
    (  # thrust fill (CuPy/thrust device_vector)
        '_ZN6thrust8cuda_cub4core13_kernel_agentINS0_14__parallel_for16ParallelForAgentINS0_20__uninitialized'
        '_fill7functorINS_10device_ptrIfEEfEEmEES9_mEEvT0_T1_',
        'void thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__parallel_for::ParallelForAgent<thrust'
        '::cuda_cub::__uninitialized_fill::functor<thrust::device_ptr<float>, float>, unsigned long>, thrust:'
        ':cuda_cub::__uninitialized_fill::functor<thrust::device_ptr<float>, float>, unsigned long>(thrust::c'
        'uda_cub::__uninitialized_fill::functor<thrust::device_ptr<float>, float>, unsigned long)',
        'thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__parallel_for::ParallelForAgent<thrust::cud'
        'a_cub::__uninitialized_fill::functor<thrust::device_ptr<float>, float>, unsigned long>, thrust::cuda'
        '_cub::__uninitialized_fill::functor<thrust::device_ptr<float>, float>, unsigned long>',
    ),
    (  # thrust transform with a lambda of main()
        '_ZN6thrust8cuda_cub4core13_kernel_agentINS0_14__parallel_for16ParallelForAgentINS0_11__transform18bi'
        'nary_transform_fINS_6detail15normal_iteratorINS_10device_ptrIfEEEESB_SB_NS5_14no_stencil_tagEZ4mainE'
        'UlffE_NS5_21always_true_predicateEEElEESF_lEEvT0_T1_',
        'void thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__parallel_for::ParallelForAgent<thrust'
        '::cuda_cub::__transform::binary_transform_f<thrust::detail::normal_iterator<thrust::device_ptr<float'
        '> >, thrust::detail::normal_iterator<thrust::device_ptr<float> >, thrust::detail::normal_iterator<th'
        'rust::device_ptr<float> >, thrust::cuda_cub::__transform::no_stencil_tag, main::{lambda(float, float'
        ')#1}, thrust::cuda_cub::__transform::always_true_predicate>, long>, thrust::cuda_cub::__transform::b'
        'inary_transform_f<thrust::detail::normal_iterator<thrust::device_ptr<float> >, thrust::detail::norma'
        'l_iterator<thrust::device_ptr<float> >, thrust::detail::normal_iterator<thrust::device_ptr<float> >,'
        ' thrust::cuda_cub::__transform::no_stencil_tag, main::{lambda(float, float)#1}, thrust::cuda_cub::__'
        'transform::always_true_predicate>, long>(thrust::cuda_cub::__transform::binary_transform_f<thrust::d'
        'etail::normal_iterator<thrust::device_ptr<float> >, thrust::detail::normal_iterator<thrust::device_p'
        'tr<float> >, thrust::detail::normal_iterator<thrust::device_ptr<float> >, thrust::cuda_cub::__transf'
        'orm::no_stencil_tag, main::{lambda(float, float)#1}, thrust::cuda_cub::__transform::always_true_pred'
        'icate>, long)',
        'thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__parallel_for::ParallelForAgent<thrust::cud'
        'a_cub::__transform::binary_transform_f<thrust::detail::normal_iterator<thrust::device_ptr<float> >, '
        'thrust::detail::normal_iterator<thrust::device_ptr<float> >, thrust::detail::normal_iterator<thrust:'
        ':device_ptr<float> >, thrust::cuda_cub::__transform::no_stencil_tag, main::{lambda(float, float)#1},'
        ' thrust::cuda_cub::__transform::always_true_predicate>, long>, thrust::cuda_cub::__transform::binary'
        '_transform_f<thrust::detail::normal_iterator<thrust::device_ptr<float> >, thrust::detail::normal_ite'
        'rator<thrust::device_ptr<float> >, thrust::detail::normal_iterator<thrust::device_ptr<float> >, thru'
        'st::cuda_cub::__transform::no_stencil_tag, main::{lambda(float, float)#1}, thrust::cuda_cub::__trans'
        'form::always_true_predicate>, long>',
    ),
    (  # thrust merge sort, comparison by function pointer
        '_ZN6thrust8cuda_cub4core13_kernel_agentINS0_12__merge_sort14BlockSortAgentIPP8hittableS7_lPFbPKS5_S9'
        '_ENS_6detail17integral_constantIbLb0EEESE_EEbS7_S7_lS7_S7_SB_EEvT0_T1_T2_T3_T4_T5_T6_',
        'void thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__merge_sort::BlockSortAgent<hittable**'
        ', hittable**, long, bool (*)(hittable const*, hittable const*), thrust::detail::integral_constant<bo'
        'ol, false>, thrust::detail::integral_constant<bool, false> >, bool, hittable**, hittable**, long, hi'
        'ttable**, hittable**, bool (*)(hittable const*, hittable const*)>(bool, hittable**, hittable**, long'
        ', hittable**, hittable**, bool (*)(hittable const*, hittable const*))',
        'thrust::cuda_cub::core::_kernel_agent<thrust::cuda_cub::__merge_sort::BlockSortAgent<hittable**, hit'
        'table**, long, bool (*)(hittable const*, hittable const*), thrust::detail::integral_constant<bool, f'
        'alse>, thrust::detail::integral_constant<bool, false> >, bool, hittable**, hittable**, long, hittabl'
        'e**, hittable**, bool (*)(hittable const*, hittable const*)>',
    ),
    (  # cub reduction (TensorFlow)
        '_ZN3cub18DeviceReduceKernelINS_18DeviceReducePolicyIfiNS_3SumEE9Policy600ENS_22TransformInputIterato'
        'rIfN10tensorflow10squareHalfIfEEPflEES9_iS2_EEvT0_T1_T2_NS_13GridEvenShareISD_EET3_',
        'void cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, cub::Transfor'
        'mInputIterator<float, tensorflow::squareHalf<float>, float*, long>, float*, int, cub::Sum>(cub::Tran'
        'sformInputIterator<float, tensorflow::squareHalf<float>, float*, long>, float*, int, cub::GridEvenSh'
        'are<int>, cub::Sum)',
        'cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, cub::TransformInpu'
        'tIterator<float, tensorflow::squareHalf<float>, float*, long>, float*, int, cub::Sum>',
    ),
    (  # cub's empty kernel in its versioned namespace
        '_ZN3cub17CUB_200200_860_NS11EmptyKernelIvEEvv',
        'void cub::CUB_200200_860_NS::EmptyKernel<void>()',
        'cub::CUB_200200_860_NS::EmptyKernel<void>',
    ),
    (  # cuBLAS gemv, float
        '_Z17gemv2T_kernel_valIiiffffLi128ELi16ELi4ELi4ELb0ELb1E18cublasGemvParamsExIi30cublasGemvTensorStrid'
        'edBatchedIKfES3_S1_IfEfEEvT11_T4_S7_',
        'void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, true, cublasGemvP'
        'aramsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const'
        '>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBa'
        'tched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<floa'
        't>, float>, float, float)',
        'gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, true, cublasGemvParams'
        'Ex<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cu'
        'blasGemvTensorStridedBatched<float>, float> >',
    ),
    (  # cuBLAS gemvx, bf16: a return type with brackets
        '_ZN8internal5gemvx6kernelIii13__nv_bfloat16S2_S2_fLb0ELb1ELb1ELb0ELi7ELb0E18cublasGemvParamsExIi30cu'
        'blasGemvTensorStridedBatchedIKS2_ES6_S4_IS2_EfEEENSt9enable_ifIXntT5_EvE4typeET11_',
        'std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16,'
        ' __nv_bfloat16, float, false, true, true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorS'
        'tridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvT'
        'ensorStridedBatched<__nv_bfloat16>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<'
        '__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBa'
        'tched<__nv_bfloat16>, float>)',
        'internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, false, true, t'
        'rue, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, c'
        'ublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, f'
        'loat> >',
    ),
    (  # cuBLAS's CUTLASS GEMM, f16 tensor cores
        '_ZN7cutlass7Kernel2I66cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x6_tn_align8EEvNT_6Param'
        'sE',
        'void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x6_tn_align8>(cutlass_80'
        '_tensorop_f16_s16816gemm_relu_f16_256x128_32x6_tn_align8::Params)',
        'cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x6_tn_align8>',
    ),
    (  # cuBLAS's CUTLASS GEMM, SIMT
        '_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE',
        'void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(cutlass_80_simt_sgemm_256x128_8x4'
        '_nn_align1::Params)',
        'cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>',
    ),
    (  # PyTorch clamp: lambdas in an anonymous namespace
        '_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_49_GLOBAL__N__d2ba64fb_16_TensorCompare_cu_7'
        '1e06f4e19launch_clamp_scalarERNS_18TensorIteratorBaseEN3c106ScalarES6_NS0_6detail11ClampLimitsEENKUl'
        'vE_clEvENKUlvE5_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_',
        'void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_sc'
        'alar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#'
        '1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> '
        '>(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, '
        'c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::opera'
        'tor()() const::{lambda(float)#1}, std::array<char*, 2ul>)',
        'at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar('
        'at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::o'
        'perator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >',
    ),
    (  # PyTorch softmax: an anonymous namespace first
        '_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIfffLi4ELb0ELb0EEEvPT0_PKT_iii'
        'PKbib',
        'void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, false, false>(float*, float'
        ' const*, int, int, int, bool const*, int, bool)',
        '(anonymous namespace)::softmax_warp_forward<float, float, float, 4, false, false>',
    ),
    (  # Numba, defined inside a function (tests/fixtures/cubins/numba_gridsync_sm90)
        '_ZN8__main__11case_cubins12_3clocals_3e5gsyncB2v2B104cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3Cw6igA9duC0hk'
        'wnNGiHEkYkrqQBFBTDEwCyQe21eqwcFW3UoDGjzpQEsgzrtUEAA_3d_3dE5ArrayIfLi1E1C7mutable7alignedE',
        '__main__::case_cubins::_3clocals_3e::gsync[abi:v2][abi:cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3Cw6igA9duC0'
        'hkwnNGiHEkYkrqQBFBTDEwCyQe21eqwcFW3UoDGjzpQEsgzrtUEAA_3d_3d](Array<float, 1, C, mutable, aligned>)',
        '__main__.case_cubins.<locals>.gsync',
    ),
    (  # Numba, module level (tests/fixtures/pc/fma0.cubin)
        '_ZN10benchmarks17bench_pc_sampling3fmaB2v2B108cw51cXTLSUwv1sDUaKthqaNgoKmjgMVuW1AiA8rAEg2UjxRKtuAI0F'
        'EA2gSVRE8cSMKQdIgkgJq2YBJIfrWtVofFgLqVAjQm1YGSQJ5xrSYAE5ArrayIfLi1E1C7mutable7alignedEff',
        'benchmarks::bench_pc_sampling::fma[abi:v2][abi:cw51cXTLSUwv1sDUaKthqaNgoKmjgMVuW1AiA8rAEg2UjxRKtuAI0'
        'FEA2gSVRE8cSMKQdIgkgJq2YBJIfrWtVofFgLqVAjQm1YGSQJ5xrSYA](Array<float, 1, C, mutable, aligned>, float'
        ', float)',
        'benchmarks.bench_pc_sampling.fma',
    ),
    (  # CUTLASS 2 GEMM, 1,900 characters: c++filt and libstdc++ refuse names over 1,024 characters
        '_ZN7cutlass6KernelINS_4gemm6kernel4GemmINS1_11threadblock12MmaPipelinedINS1_9GemmShapeILi128ELi128EL'
        'i8EEENS_9transform11threadblock22PredicatedTileIteratorINS_11MatrixShapeILi128ELi8EEEfNS_6layout8Row'
        'MajorELi1ENS8_30PitchLinearStripminedThreadMapINSD_16PitchLinearShapeILi8ELi128EEELi256ELi1EEELi1EEE'
        'NS9_19RegularTileIteratorISC_fNSD_11ColumnMajorELi1ENS8_33TransposePitchLinearThreadMapSimtISI_EELi4'
        'EEENSA_INSB_ILi8ELi128EEEfSE_Li0ENSF_INSG_ILi128ELi8EEELi256ELi1EEELi1EEENSK_ISP_fSE_Li0ESR_Li4EEEfS'
        'E_NS4_9MmaPolicyINS1_4warp7MmaSimtINS6_ILi32ELi64ELi8EEEfSL_fSE_fSE_NSV_13MmaSimtPolicyINSB_ILi4ELi8'
        'EEENSD_19RowMajorInterleavedILi2EEENS6_ILi4ELi4ELi1EEEEELi1ELNS_16ComplexTransformE0ELS14_0EbEENSB_I'
        'Li4ELi0EEENSB_ILi0ELi0EEELi1EEENS_21NumericArrayConverterIffLi4ELNS_15FloatRoundStyleE2EEES1B_bEENS_'
        '8epilogue11threadblock8EpilogueIS7_S15_Li1ENS1E_22PredicatedTileIteratorINS1E_26OutputTileOptimalThr'
        'eadMapINS1E_15OutputTileShapeILi128ELi1ELi4ELi4ELi1EEENS1I_ILi1ELi4ELi2ELi1ELi8EEELi256ELi1ELi32EEEf'
        'EENS1D_4warp20FragmentIteratorSimtISX_NS1_6thread3MmaINS6_ILi8ELi8ELi1EEEfSL_fSE_fSE_NS_4arch13OpMul'
        'tiplyAddEbEESE_S13_EENS1N_16TileIteratorSimtISX_S1U_fSE_S13_EENS1E_18SharedLoadIteratorINS1L_18Compa'
        'ctedThreadMapEfLi4EEENS1D_6thread17LinearCombinationIfLi1EffLNS21_9ScaleType4KindE0ELS1A_2EEENSB_ILi'
        '0ELi17EEELi1EEENS4_30GemmIdentityThreadblockSwizzleILi1EEELb0EEEEEvNT_6ParamsE',
        SAME,
        SAME,
    ),
]
#: The fallback parser answers these (the others it gives back unchanged: lambdas and local names, function
#: pointer types, names c++filt refuses).
FALLBACK_ANSWERS = {0, 3, 4, 5, 6, 7, 8, 10, 11, 12}


def _rows():
    return [(s, s if text is SAME else text, s if name is SAME else name) for s, text, name in LIBRARY_SYMBOLS]


@pytest.fixture
def toolchain():
    if _names._toolchain() is None:
        pytest.skip("libstdc++'s __cxa_demangle cannot be loaded here")


@pytest.fixture
def no_toolchain(monkeypatch):
    """As on a machine without libstdc++: the fallback parser names the kernels."""
    monkeypatch.setattr(_names, "_toolchain", lambda: None)
    for cached in (demangle, demangled_text):
        cached.cache_clear()
    yield
    for cached in (demangle, demangled_text):
        cached.cache_clear()


@pytest.mark.parametrize("symbol, text, readable", _rows(), ids=[r[0][:40] for r in _rows()])
def test_library_names_as_cxxfilt_prints_them(toolchain, symbol, text, readable):
    assert demangled_text(symbol) == text
    assert demangle(symbol) == readable
    assert _source.demangle(symbol) == text and _source.pretty_function(symbol) == readable  # one demangler


def test_the_fallback_agrees_with_cxxfilt_or_leaves_the_symbol(no_toolchain):
    rows = _rows()
    answered = {i for i, (symbol, _, readable) in enumerate(rows) if demangle(symbol) == readable != symbol}
    declined = {i for i, (symbol, _, readable) in enumerate(rows) if demangle(symbol) == symbol}
    assert answered == FALLBACK_ANSWERS
    assert answered | declined == set(range(len(rows)))  # never a third, wrong name
    assert demangled_text(rows[0][0]) == rows[0][0]  # no text without the toolchain


def recorded_symbols():
    meta = json.loads(str(np.load(FIXTURES / "range" / "auto_3kernels_gh100.npz")["meta"]))
    launches = [launch["symbol"] for launch in meta["launches"]]
    pc = sorted(set(np.load(FIXTURES / "pc" / "pc_records.npz")["function"].tolist()))
    return launches, pc


@pytest.mark.parametrize("mode", ["toolchain", "no_toolchain"])
def test_numba_symbols_of_the_recordings(request, mode):
    request.getfixturevalue(mode)
    launches, pc = recorded_symbols()
    assert [demangle(s) for s in launches] == ["__main__.stream", "__main__.fma", "__main__.inc"]
    assert [demangle(s) for s in pc] == ["benchmarks.bench_pc_sampling.fma", "benchmarks.bench_pc_sampling.stream"]


@pytest.mark.parametrize("mode", ["toolchain", "no_toolchain"])
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
        ("_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfEEEEvNT_6ParamsE",
         "cutlass::Kernel<cutlass::gemm::kernel::Gemm<float> >"),
        ("_ZN4cuda3std3__46detail5sliceIN6thrust7complexIfEEEEvv",
         "cuda::std::__4::detail::slice<thrust::complex<float> >"),
        ("_Z5saxpyfPfS_", "saxpy"),
        ("_Zgarbage", "_Zgarbage"),  # not readable: unchanged, never an exception
        ("_ZN3foo", "_ZN3foo"),
    ],
)
def test_readable_names(request, mode, symbol, readable):
    request.getfixturevalue(mode)
    assert demangle(symbol) == readable


def test_numba_path_for_the_dispatcher_lookup(toolchain):
    numba = LIBRARY_SYMBOLS[-2][0]
    assert _names.numba_path(numba) == ["benchmarks", "bench_pc_sampling", "fma"]
    assert _names.numba_path(LIBRARY_SYMBOLS[0][0]) == [] and _names.numba_path("cupy_add") == []


def test_short_names_are_what_the_user_calls_the_kernel():
    assert short_name("__main__.main.<locals>.fma") == "fma"
    assert short_name("__main__.stream") == "stream"
    assert short_name("ns::kernel<float, 4>") == "ns::kernel<float, 4>"  # C++ keeps its scope and arguments
    assert short_name("cupy_add") == "cupy_add"


def test_brief_names_for_legends():
    # the H200 recording's CUB kernel: the function alone, its scope and template arguments left out
    cub = ("cub::CUB_300102_SM_750_800_860_890_900_1000_1200::detail::reduce::DeviceReduceKernel<cub::CUB_300102_"
           "SM_750_800_860_890_900_1000_1200::detail::reduce::policy_hub<float, unsigned int, cuda::std::__4::plus"
           "<void> >::Policy1000, float*, unsigned int, cuda::std::__4::plus<void>, float, cuda::std::__4::identity>")
    assert _names.brief_name(cub) == "DeviceReduceKernel"
    assert _names.brief_name("__main__.main.<locals>.fma") == "fma"
    assert _names.brief_name("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")[-4:] == "_NNT"  # extern "C": as is


def test_kernel_names_disambiguate_only_when_needed():
    names = KernelNames()
    assert names.name("__main__.main.<locals>.fma") == "fma"
    assert names.name("__main__.stream") == "stream"
    assert names.name("__main__.main.<locals>.fma") == "fma"  # the same kernel, the same name
    # another kernel called fma: the shortest ending of its qualified name that tells it apart (never "<locals>.fma")
    assert names.name("__main__.helper.<locals>.fma") == "helper.<locals>.fma"
    assert names.name("mylib.kernels.stream") == "kernels.stream"
    assert names.name("ns::kernel<float>", short="kernel") == "kernel"  # a preferred short name (a decorated kernel)
    assert names.name("fma") == "fma (2)"  # an extern "C" fma: no ending left to tell it apart
    assert names.name("__main__.main.<locals>.fma") == "fma"  # a name once given never changes
