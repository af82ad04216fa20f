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


def load_in_child(cwd=None, **env):
    """``_lib.load()`` in a fresh process: ``ok <path> <only that libcupti mapped> <version>`` or
    ``<error class> <message>``."""
    code = textwrap.dedent(
        """
        from gpuscope.cupti import _lib
        try:
            lib = _lib.load()
        except Exception as e:
            print(type(e).__name__, e)
        else:
            maps = {l.split()[-1] for l in open('/proc/self/maps') if 'libcupti' in l}
            print('ok', lib.path, sorted(maps) == [lib.path], lib.version_string)
        """
    )
    full_env = {**os.environ, "PYTHONPATH": ROOT, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120,
                         cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def real_cupti():
    """The CUPTI wheel installed with the tests (13.1), symlinks resolved."""
    return os.path.realpath(_lib.load().path)


def test_env_override_folder_without_cupti(tmp_path):
    out = load_in_child(GPUSCOPE_CUPTI_LIB=str(tmp_path))
    assert out.startswith("CuptiNotFoundError"), out
    assert f"{tmp_path} has no libcupti.so.12/13" in out and "Set GPUSCOPE_CUPTI_LIB to" in out


def test_env_override_folder_with_cupti(real_cupti):
    out = load_in_child(GPUSCOPE_CUPTI_LIB=os.path.dirname(real_cupti))
    assert out == f"ok {real_cupti} True 13.1"


def test_relative_path_in_cwd_is_what_is_loaded(real_cupti):
    # a path with a slash that exists relative to the current folder is that file: probed and loaded from there
    name = os.path.basename(real_cupti)
    out = load_in_child(cwd=os.path.dirname(real_cupti), GPUSCOPE_CUPTI_LIB=f"./{name}", LD_LIBRARY_PATH="")
    assert out == f"ok {real_cupti} True 13.1"


def test_a_bare_name_never_means_a_file_in_the_cwd(tmp_path, real_cupti):
    # dlopen("libcupti.so.13") does not look in the current folder, so neither does GPUSCOPE_CUPTI_LIB: a broken
    # copy there is not what a bare name means (the old loader took it and failed)
    (tmp_path / "libcupti.so.13").write_bytes(b"not an ELF file")
    out = load_in_child(cwd=tmp_path, GPUSCOPE_CUPTI_LIB="libcupti.so.13",
                        LD_LIBRARY_PATH=os.path.dirname(real_cupti))
    assert out == f"ok {real_cupti} True 13.1"


def test_a_broken_file_named_by_path_is_reported(tmp_path, real_cupti):
    # named with ./ it is that file, and the error says what is wrong with it (and nothing about a driver)
    (tmp_path / "libcupti.so.13").write_bytes(b"not an ELF file")
    out = load_in_child(cwd=tmp_path, GPUSCOPE_CUPTI_LIB="./libcupti.so.13",
                        LD_LIBRARY_PATH=os.path.dirname(real_cupti))
    assert out.startswith(
        f"CuptiNotFoundError {tmp_path}/libcupti.so.13 (from GPUSCOPE_CUPTI_LIB) cannot be loaded as a library"
    ), out
    assert "Set GPUSCOPE_CUPTI_LIB to a libcupti.so.12 or libcupti.so.13" in out
    assert "driver" not in out


def test_bare_name_is_found_where_the_loader_finds_it(tmp_path, real_cupti):
    out = load_in_child(cwd=tmp_path, GPUSCOPE_CUPTI_LIB="libcupti.so.13",
                        LD_LIBRARY_PATH=os.path.dirname(real_cupti))
    assert out == f"ok {real_cupti} True 13.1"


def test_bare_name_found_nowhere(tmp_path):
    out = load_in_child(cwd=tmp_path, GPUSCOPE_CUPTI_LIB="libcupti.so.99", LD_LIBRARY_PATH="")
    assert out.startswith(
        "CuptiNotFoundError GPUSCOPE_CUPTI_LIB=libcupti.so.99: the dynamic loader does not find it"
    ), out
    assert "never in the current folder: give a path (./ for one there)" in out


def test_relative_path_that_does_not_exist(tmp_path):
    out = load_in_child(cwd=tmp_path, GPUSCOPE_CUPTI_LIB="lib/libcupti.so.13")
    assert out.startswith(
        f"CuptiNotFoundError GPUSCOPE_CUPTI_LIB=lib/libcupti.so.13: {tmp_path}/lib/libcupti.so.13 does not exist"
    ), out


def test_a_library_that_is_not_cupti():
    # a real shared object without CUPTI's symbols: no AttributeError, no "needs the driver"
    import _ctypes

    out = load_in_child(GPUSCOPE_CUPTI_LIB=_ctypes.__file__)
    assert out == (f"CuptiNotFoundError {_ctypes.__file__} (from GPUSCOPE_CUPTI_LIB) is not a CUPTI library (it has "
                   f"no cuptiGetVersion). {_lib.SET_HELP}")


def _fake_cupti(tmp_path, body: str):
    """A shared library whose cuptiGetVersion runs *body* (C), built with the system compiler."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a fake CUPTI")
    src = tmp_path / "fake.c"
    src.write_text("int cuptiGetVersion(unsigned *v) { %s }\n" % body)
    lib = tmp_path / "libcupti.so.12"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def test_a_cupti_too_old(tmp_path):
    lib = _fake_cupti(tmp_path, "*v = 20; return 0;")  # API version 20: CUPTI 12.5 or older
    out = load_in_child(GPUSCOPE_CUPTI_LIB=str(tmp_path))
    assert out == (f"CuptiNotFoundError {lib} (from GPUSCOPE_CUPTI_LIB) is CUPTI 12.5; gpuscope needs 12.6 or later "
                   f"(Range Profiler and Profiler Host API). {_lib.SET_HELP}")


def test_a_cupti_whose_first_call_fails(tmp_path):
    lib = _fake_cupti(tmp_path, "return 999;")
    out = load_in_child(GPUSCOPE_CUPTI_LIB=str(lib))
    assert out.startswith("CuptiNotFoundError"), out
    if _lib.driver_available():
        assert "cuptiGetVersion failed with status 999" in out
    else:  # what CUPTI 13.2+ does without a driver
        assert f"CUPTI at {lib} does not work on this machine, which has no NVIDIA driver" in out


def test_broken_library_names_the_path_and_what_to_set(tmp_path):
    fake = tmp_path / "libcupti.so.13"
    fake.write_bytes(b"not an ELF file")
    out = load_in_child(GPUSCOPE_CUPTI_LIB=str(fake))
    assert out.startswith(f"CuptiNotFoundError {fake} (from GPUSCOPE_CUPTI_LIB) cannot be loaded as a library"), out
    assert _lib.SET_HELP in out and "driver" not in out


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


def test_the_version_probe_never_starts_a_frozen_app(monkeypatch):
    started = []
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # PyInstaller: sys.executable is the application
    monkeypatch.delenv("GPUSCOPE_PYTHON", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *args, **kw: started.append(args))
    with pytest.raises(errors.CuptiNotFoundError, match=r"Could not probe CUPTI at /x/libcupti.so.13: this is a "
                                                        r"frozen application: sys.executable \(.*\) is the application"):
        _lib._probe_version_in_child("/x/libcupti.so.13")
    assert started == []


def test_load_soon_loads_once_on_a_thread_and_load_finds_it(monkeypatch):
    """A session starts loading libcupti on a thread while CUDA initialises; its own load() then gets the same
    library (or waits for the thread), and a second load_soon starts nothing and does not wait for the loading."""
    import threading
    import time

    from gpuscope.cupti import _lib

    opened, entered, release = [], threading.Event(), threading.Event()

    def slow_open(path, found_via):
        entered.set()
        release.wait(10)
        opened.append(threading.current_thread().name)
        return "the library"

    monkeypatch.setattr(_lib, "_loaded", None)
    monkeypatch.setattr(_lib, "_loading", None)
    monkeypatch.setattr(_lib, "_candidates", lambda: [("/x/libcupti.so", "test")])
    monkeypatch.setattr(_lib, "_pathfinder_path", lambda: None)
    monkeypatch.setattr(_lib, "_open", slow_open)
    _lib.load_soon()
    thread = _lib._loading
    assert entered.wait(10)  # the thread is loading (under load's lock)
    waited = time.perf_counter()
    _lib.load_soon()  # another caller (gpuscope run, then the Profiler) neither waits for it nor loads again
    assert time.perf_counter() - waited < 5 and not release.is_set()
    assert _lib._loading is thread and thread.name == "gpuscope-cupti-load"
    # the session's load() waits for the thread
    threading.Timer(0.2, release.set).start()
    assert _lib.load() == "the library"
    thread.join(10)
    assert opened == ["gpuscope-cupti-load"]
