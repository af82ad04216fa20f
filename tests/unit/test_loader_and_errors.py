"""Loading CUPTI, the error family, and what ``import gpuscope`` must not do."""

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import gpuscope
from gpuscope import errors
from gpuscope.cupti import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, **env):
    full_env = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_import_loads_no_cuda_and_no_cupti():
    out = run_python(
        """
        import sys, gpuscope
        gpuscope.__version__, gpuscope.list_metrics, gpuscope.GpuscopeError, gpuscope.metric_set
        import gpuscope.metrics.catalog
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'cupy', 'cuda', 'matplotlib'))
        maps = [l for l in open('/proc/self/maps') if 'cupti' in l or 'nvperf' in l or 'libcuda' in l]
        print(heavy, len(maps))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] 0"


def test_unknown_public_name():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpuscope.nope


@pytest.mark.parametrize("api,expected", [(24, (12, 6)), (26, (12, 8)), (28, (12, 9)), (130001, (13, 0)),
                                          (130101, (13, 1)), (130500, (13, 5)), (18, (12, 5))])
def test_version_from_api(api, expected):
    assert _lib.version_from_api(api) == expected


def test_env_override_missing_file(tmp_path):
    out = run_python(
        """
        from gpuscope.cupti import _lib
        from gpuscope.errors import CuptiNotFoundError
        try:
            _lib.load()
        except CuptiNotFoundError as e:
            print(isinstance(e, ImportError), e)
        """,
        GPUSCOPE_CUPTI_LIB=str(tmp_path / "nothing.so"),
    )
    assert out.stdout.startswith("True GPUSCOPE_CUPTI_LIB="), out.stderr
    assert "does not exist" in out.stdout


def test_env_override_folder_without_cupti(tmp_path):
    out = run_python("from gpuscope.cupti import _lib\n_lib.load()", GPUSCOPE_CUPTI_LIB=str(tmp_path))
    assert out.returncode != 0
    assert "without libcupti.so.12/13" in out.stderr


def test_broken_library_gives_install_advice(tmp_path):
    fake = tmp_path / "libcupti.so.13"
    fake.write_bytes(b"not an ELF file")
    out = run_python(
        """
        from gpuscope.cupti import _lib
        try:
            _lib.load()
        except Exception as e:
            print(type(e).__name__, e)
        """,
        GPUSCOPE_CUPTI_LIB=str(fake),
    )
    assert out.stdout.startswith("CuptiNotFoundError"), out.stderr
    assert "gpuscope[offline]" in out.stdout or "gpuscope[cu13]" in out.stdout


def test_loaded_cupti_is_supported():
    lib = _lib.load()
    assert lib.version >= (12, 6)
    assert os.path.basename(lib.path).startswith("libcupti.so.1")


def test_nvperf_comes_from_cupti_folder():
    # libcupti dlopens libnvperf_* by bare name; gpuscope preloads the copies beside it (notes 1.3).
    from gpuscope.cupti import host

    host.supported_chips()
    lib = _lib.load()
    maps = {line.split()[-1] for line in open("/proc/self/maps") if "libnvperf_host" in line}
    assert maps == {os.path.join(lib.directory, "libnvperf_host.so")}


@pytest.mark.parametrize(
    "status,cls,builtin",
    [
        (35, errors.CuptiPermissionError, PermissionError),
        (1, errors.CuptiValueError, ValueError),
        (17, errors.CuptiValueError, ValueError),
        (46, errors.CuptiValueError, ValueError),
        (8, errors.CuptiMemoryError, MemoryError),
        (27, errors.CuptiNotSupportedError, RuntimeError),
        (26, errors.ProfilerBusyError, RuntimeError),
        (39, errors.ProfilerBusyError, RuntimeError),
        (999, errors.CuptiError, errors.GpuscopeError),
    ],
)
def test_status_maps_to_error_class(status, cls, builtin):
    err = errors.cupti_error(status, "cuptiSomething", "CUPTI_ERROR_X")
    assert type(err) is cls
    assert isinstance(err, builtin) and isinstance(err, errors.GpuscopeError)
    assert (err.status, err.func, err.cupti_message) == (status, "cuptiSomething", "CUPTI_ERROR_X")
    assert "cuptiSomething failed: CUPTI_ERROR_X" in str(err)


def test_permission_error_says_what_to_do():
    err = errors.cupti_error(35, "cuptiRangeProfilerStart", "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in str(err)
    assert "ERR_NVGPUCTRPERM" in str(err)
    busy = errors.cupti_error(26, "cuptiRangeProfilerEnable", "CUPTI_ERROR_HARDWARE_BUSY")
    assert "Nsight Compute" in str(busy)


def test_cupti_error_pickles():
    err = errors.cupti_error(35, "f", "m")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.CuptiPermissionError and str(back) == str(err)


def test_checked_call_raises_with_cupti_message():
    from gpuscope.cupti import host

    with pytest.raises(errors.CuptiValueError) as info:
        host.ProfilerHost("NOTACHIP")
    assert info.value.func == "cuptiProfilerHostInitialize"
    assert info.value.status in (1, 46)
    assert "CUPTI_ERROR" in info.value.cupti_message


def test_missing_symbol_names_the_version(monkeypatch):
    from ctypes import c_int

    from gpuscope.cupti._api import Functions

    table = Functions("cupti_fake.h", {"cuptiDoesNotExist": [c_int]}, since={"cuptiDoesNotExist": (14, 0)})
    with pytest.raises(errors.CuptiNotFoundError, match="needs CUPTI 14.0"):
        table.cuptiDoesNotExist(1)
    with pytest.raises(AttributeError, match="not declared"):
        table.cuptiOther
