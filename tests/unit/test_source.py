"""Names and cubin discovery for PC-to-source mapping (no GPU)."""

import pytest

from gpuscope._pc_sampling import source as _source

NUMBA_NAME = "_ZN6cudapy5tests3gpu7test_pc10stream_addB2v1B6cw51cXE5ArrayIfLi1E1C7mutable7alignedEf"


def test_demangle_numba_and_cxx_names():
    assert _source.demangle(NUMBA_NAME) == (
        "cudapy::tests::gpu::test_pc::stream_add[abi:v1][abi:cw51cX](Array<float, 1, C, mutable, aligned>, float)"
    )
    assert _source.demangle("_Z3fooPfi") == "foo(float*, int)"
    assert _source.demangle("saxpy") == "saxpy"  # extern "C"
    assert _source.demangle("_Zgarbage") == "_Zgarbage"


@pytest.mark.parametrize(
    "mangled,pretty",
    [
        (NUMBA_NAME, "tests.gpu.test_pc.stream_add"),
        ("_ZN6cudapy8__main__6kernelB2v1E5ArrayIfLi1E1C7mutable7alignedE", "__main__.kernel"),
        ("_ZN2ns6kernelIfEEvPT_i", "ns::kernel<float>"),
        ("cupy_add", "cupy_add"),
    ],
)
def test_pretty_function(mangled, pretty):
    assert _source.pretty_function(mangled) == pretty


def test_registry_adds_bytes_and_paths(tmp_path):
    reg = _source.CubinRegistry(crc=lambda b: len(b))
    path = tmp_path / "k.cubin"
    path.write_bytes(b"\x7fELF12345")
    assert reg.add(b"\x7fELF1") == [5]
    assert reg.add(str(path)) == [9]
    assert reg.get(9) == b"\x7fELF12345"
    assert reg.get(7) is None
    with pytest.raises(TypeError, match="cubin bytes or a path"):
        reg.add(3.5)


def test_cupy_cache_cubins_strip_the_hash_prefix(tmp_path):
    (tmp_path / "a.cubin").write_bytes(b"0123456789abcdef0123456789abcdef01234567" + b"\x7fELFbody")
    (tmp_path / "b.cubin").write_bytes(b"not an elf")
    (tmp_path / "c.txt").write_bytes(b"\x7fELFother")
    assert _source.cupy_cache_cubins(str(tmp_path)) == [b"\x7fELFbody"]
    assert _source.cupy_cache_cubins(str(tmp_path / "missing")) == []


def test_a_cupy_cubin_is_found_by_the_crc_of_the_image_cupy_loads(tmp_path, monkeypatch):
    """CuPy's load adds a NUL to the cached cubin (the driver's module, as CUPTI reported it on the H100, was the
    cached bytes and one 0 more): PC samples and SASS records carry the CRC of that image."""
    import zlib

    cubin = b"\x7fELF" + bytes(range(200))
    (tmp_path / "k.cubin").write_bytes(b"0123456789abcdef0123456789abcdef01234567" + cubin)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    reg = _source.CubinRegistry(crc=zlib.crc32)
    loaded = zlib.crc32(cubin + b"\0")
    assert reg.get(loaded) is not None and reg.get(loaded).rstrip(b"\0") == cubin.rstrip(b"\0")
    assert reg.get(zlib.crc32(cubin)) is not None  # as cached, for a loader that passes the size


def test_numba_cubins_rejects_other_objects():
    with pytest.raises(TypeError, match="not a Numba"):
        _source.numba_cubins(object())


def test_source_map_without_lineinfo_keeps_function_and_counts_it():
    reg = _source.CubinRegistry(crc=lambda b: 1)
    reg.add(b"\x7fELF")
    smap = _source.SourceMap(reg, lookup=lambda c, f, o: (0, "", ""))
    loc = smap.locate(1, "kern", 32)
    assert (loc.file, loc.line, loc.known) == ("", 0, False)
    assert smap.without_lineinfo == {"kern"}
    assert smap.locate(2, "other", 0).line == 0
    assert smap.without_cubin == {"other"}


def test_source_map_line_text_from_given_sources():
    reg = _source.CubinRegistry(crc=lambda b: 1)
    reg.add(b"\x7fELF")
    smap = _source.SourceMap(reg, lookup=lambda c, f, o: (2, "k.cu", "/far/away"),
                             sources={"k.cu": "int a;\n  y[i] = x[i];\n"})
    loc = smap.locate(1, "k", 16)
    assert (loc.file, loc.line, loc.text) == ("/far/away/k.cu", 2, "y[i] = x[i];")


def test_second_compile_with_the_same_crc_resolves_through_the_first_name(monkeypatch):
    """CUPTI keeps the first cubin it parsed per CRC, and the CRC leaves names out: a recompiled Numba kernel
    (tag v3 -> v5, same code) is rejected under its new name, so gpuscope asks under the name that resolved first
    (measured on the H100: probes/probe_pc_between.py --steps)."""
    from gpuscope.errors import CuptiValueError

    monkeypatch.setattr(_source, "_resolved", {})
    first = NUMBA_NAME.replace("B2v1", "B2v3")
    second = NUMBA_NAME.replace("B2v1", "B2v5")
    other = NUMBA_NAME.replace("10stream_add", "9other_add")
    parsed: dict[int, str] = {}  # CUPTI's cache: CRC -> the names of the first cubin given

    def cupti(cubin, function, offset):
        names = parsed.setdefault(7, cubin.decode())
        if function not in names.split():
            raise CuptiValueError(1, "cuptiGetSassToSourceCorrelation", "CUPTI_ERROR_INVALID_PARAMETER")
        return 12, "k.py", "/src"

    reg1 = _source.CubinRegistry(crc=lambda b: 7)
    reg1.add(f"{first} {other}".encode())
    assert _source.SourceMap(reg1, lookup=cupti).locate(7, first, 16).line == 12
    reg2 = _source.CubinRegistry(crc=lambda b: 7)
    reg2.add(f"{second} {other}".encode())
    smap = _source.SourceMap(reg2, lookup=cupti)
    assert smap.locate(7, second, 16).line == 12 and not smap.without_lineinfo
    # a name that is not the same kernel but for the tag is not guessed
    assert smap.locate(7, second.replace("10stream_add", "10stream_sub"), 16).line == 0
    assert _source._without_version_tag(second) == _source._without_version_tag(first) == NUMBA_NAME.replace(
        "B2v1", "")
