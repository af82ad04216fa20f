"""Bad arguments to every public entry point of PM sampling, phases, aggregate and the file functions: each is
refused with TypeError/ValueError naming the argument, the value and what is allowed, before any CUDA or CUPTI
work, and gpuscope stays usable (issue 13, item 12).

The table is the property: for each entry point, values that used to pass and misbehave (an infinite decode
period killed the decode thread, NaN busy-spun it, 2**70 bytes wrapped to 0, metrics=[] failed deep inside
numpy, a numpy weight averaged silently wrong, None reached h5py).
"""

import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope._util import validate as _validate
from gpuscope.metrics import phases as phases_mod

DATA = Path(gs.__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def timeseries():
    return gs.open_dataset(DATA / "demo_timeseries.nc")


@pytest.fixture(scope="module")
def td():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.topdown(gs.open_dataset(DATA / "demo_launches.nc"))


# (argument, bad value, exception, words the message must hold besides the argument's name)
SAMPLER_BAD = [
    ("decode_period", INF, ValueError, ["finite", "inf"]),
    ("decode_period", NAN, ValueError, ["finite", "nan"]),
    ("decode_period", -0.01, ValueError, ["above 0"]),
    ("decode_period", 0, ValueError, ["above 0"]),
    ("decode_period", 3600, ValueError, ["at most 60"]),
    ("decode_period", "10ms", TypeError, ["'10ms'"]),
    ("interval", "1e30s", ValueError, ["60,000,000,000 ns"]),
    ("interval", "1e12cycles", ValueError, ["4,294,967,295 cycles"]),
    ("interval", datetime.timedelta(hours=2), ValueError, ["60,000,000,000"]),
    ("hardware_buffer_size", 2**70, ValueError, ["1,180,591,620,717,411,303,424", "1,099,511,627,776"]),
    ("hardware_buffer_size", 1024, ValueError, ["1,048,576"]),
    ("hardware_buffer_size", 64e6, TypeError, ["64000000.0", "integer"]),
    ("hardware_buffer_size", None, TypeError, ["None"]),
    ("image_pool", 2.5, TypeError, ["2.5", "integer"]),
    ("image_pool", 0, ValueError, ["from 1"]),
    ("image_pool", 10**9, ValueError, ["1,000,000,000", "65,536"]),
    ("image_pool", True, TypeError, ["True"]),
    ("evaluators", 1.5, TypeError, ["1.5"]),
    ("evaluators", 10**6, ValueError, ["1,000,000", "256"]),
    ("evaluators", 0, ValueError, ["from 1"]),
    ("samples_per_image", 1, ValueError, ["from 2"]),
    ("samples_per_image", 4096.0, TypeError, ["4096.0"]),
    ("samples_per_image", 2**40, ValueError, ["1,048,576"]),
    ("device", 0.0, TypeError, ["0.0"]),
    ("device", "cuda:0", TypeError, ["'cuda:0'"]),
    ("metrics", [], ValueError, ["[]"]),
    ("metrics", None, TypeError, ["None"]),
    ("metrics", ["sm__cycles_active.avg", 3], TypeError, ["3"]),
]
# refused before item 12 too (kept so that the helpers do not lose them)
SAMPLER_BAD += [
    ("interval", NAN, ValueError, ["nan"]),
    ("interval", -5.0, ValueError, ["-5.0"]),
    ("interval", "-20us", ValueError, ["'-20us'"]),
    ("interval", None, TypeError, ["None"]),
    ("evaluate_in", "gpu", ValueError, ["'process'", "'thread'", "'gpu'"]),
    ("kernels", "yes", ValueError, ["kernels", "True", "False", "'yes'"]),
    ("kernels", 1, ValueError, ["kernels", "True", "False"]),
    ("device", -1, ValueError, ["-1"]),
]


@pytest.mark.parametrize("arg, bad, exc, words", SAMPLER_BAD, ids=[f"{a}={b!r}" for a, b, _, _ in SAMPLER_BAD])
@pytest.mark.parametrize("entry", ["sample", "Sampler"])
def test_sampler_arguments(entry, arg, bad, exc, words):
    factory = gs.sample if entry == "sample" else gs.Sampler
    with pytest.raises(exc) as info:
        factory(**{arg: bad})
    message = str(info.value)
    assert arg in message and all(w in message for w in words), message
    assert _sampling._active == {}  # nothing registered: the next sampler is free to start


@pytest.mark.parametrize(
    "arg, good, normal",
    [("decode_period", 0.5, 0.5), ("hardware_buffer_size", np.int64(64 << 20), 64 << 20), ("image_pool", 16, 16),
     ("evaluators", np.uint8(3), 3), ("interval", "59s", 59 * 10**9), ("device", np.int32(1), 1)],
)
def test_sampler_accepts_good_values(arg, good, normal):
    s = gs.sample(**{arg: good})
    got = s.interval_ns if arg == "interval" else getattr(s, arg)
    assert got == normal and type(got) in (int, float) and s._state == "new"


def test_bad_arguments_touch_no_cuda_and_no_cupti():
    code = textwrap.dedent(
        """
        import sys, gpuscope as gs
        for kw in [dict(decode_period=float('inf')), dict(hardware_buffer_size=2**70), dict(image_pool=2.5),
                   dict(interval=float('nan')), dict(evaluators=10**6), dict(metrics=[])]:
            try:
                gs.sample(**kw)
            except (TypeError, ValueError):
                pass
            else:
                raise SystemExit(f"accepted {kw}")
        heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'cuda')
        maps = [l for l in open('/proc/self/maps') if 'cupti' in l or 'libcuda' in l]
        print(heavy, len(maps))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.strip() == "[] 0"


PHASES_BAD = [
    ("metrics", [], ValueError, ["[]"]),
    ("metrics", 5, TypeError, ["5"]),
    ("penalty", NAN, ValueError, ["nan"]),
    ("penalty", -1.0, ValueError, ["at least 0"]),
    ("penalty", INF, ValueError, ["inf"]),
    ("penalty", "big", TypeError, ["'big'"]),
    ("resolution", 10**7, ValueError, ["10,000,000", "18,019"]),
    ("resolution", 0, ValueError, ["from 1"]),
    ("resolution", 2.5, TypeError, ["2.5"]),
    ("min_size", 0, ValueError, ["at least 1"]),
    ("min_size", 2.5, TypeError, ["2.5"]),
    ("max_change_points", -1, ValueError, ["at least 0"]),
    ("label_tolerance", NAN, ValueError, ["nan"]),
    ("topdown", "yes", ValueError, ["'auto'", "'yes'"]),
    ("dim", 3, TypeError, ["3"]),
]


@pytest.mark.parametrize("arg, bad, exc, words", PHASES_BAD, ids=[f"{a}={b!r}" for a, b, _, _ in PHASES_BAD])
def test_phases_arguments(timeseries, arg, bad, exc, words):
    with pytest.raises(exc) as info:
        gs.phases(timeseries, **{arg: bad})
    message = str(info.value)
    assert arg in message and all(w in message for w in words), message


@pytest.mark.parametrize("bad, exc", [(None, TypeError), ("demo.nc", TypeError), (np.zeros(10), TypeError)])
def test_phases_needs_a_dataset(bad, exc):
    with pytest.raises(exc, match="ds must be an xarray.Dataset"):
        gs.phases(bad)


def test_phases_on_empty_data(timeseries):
    with pytest.raises(ValueError, match="ds has no samples along 'time'"):
        gs.phases(timeseries.isel(time=slice(0, 0)))


@pytest.mark.parametrize("arg, bad, exc", [("penalty", NAN, ValueError), ("min_size", 1.5, TypeError),
                                           ("max_change_points", -2, ValueError)])
def test_change_points_arguments(arg, bad, exc):
    with pytest.raises(exc, match=arg):
        phases_mod.change_points(np.r_[np.zeros(50), np.ones(50)], **{arg: bad})


def test_phases_still_works_after_bad_calls(timeseries):
    for kw in ({"penalty": NAN}, {"metrics": []}, {"resolution": 10**7}):
        with pytest.raises(ValueError):
            gs.phases(timeseries, **kw)
    ph = gs.phases(timeseries, resolution=18)
    assert ph.attrs["phases_resolution"] == 18 and ph.sizes["phase_id"] >= 2
    assert ph["phase"].sizes["time"] == timeseries.sizes["time"]


AGGREGATE_BAD = [
    (np.ones(15), TypeError, ["weight", "ndarray", "xr.DataArray(values, dims='range')"]),
    ([1.0] * 15, TypeError, ["weight", "list"]),
    ("no_such_weight", ValueError, ["weight", "'no_such_weight'", "not in the Dataset"]),
    (xr.DataArray(np.ones(3), dims="kernel"), ValueError, ["weight", "15 values", "'kernel': 3"]),
    (xr.DataArray(np.ones(14), dims="range"), ValueError, ["weight", "15 values", "'range': 14"]),
]


@pytest.mark.parametrize("weight, exc, words", AGGREGATE_BAD, ids=[type(w).__name__ for w, _, _ in AGGREGATE_BAD])
def test_aggregate_weight(td, weight, exc, words):
    with pytest.raises(exc) as info:
        gs.aggregate(td, weight=weight)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_aggregate_good_weights_agree(td):
    # the name and the same values as a DataArray give the same means; a DataArray of ones is the plain mean
    by_name = gs.aggregate(td, by=None, weight="launch")
    by_array = gs.aggregate(td, by=None, weight=td["launch"].astype(float))
    xr.testing.assert_allclose(by_name.drop_vars(["weight", "count"]), by_array.drop_vars(["weight", "count"]))
    plain = gs.aggregate(td, by=None, weight=xr.DataArray(np.ones(td.sizes["range"]), dims="range"))
    np.testing.assert_allclose(plain["retire"].item(), td["retire"].mean().item())


def test_aggregate_needs_a_dataset():
    with pytest.raises(TypeError, match="ds must be an xarray.Dataset"):
        gs.aggregate(None)


IO_BAD = [
    (lambda tmp, ds: gs.save_dataset(None, tmp / "x.nc"), ValueError, ["xarray.Dataset as ds", "NoneType"]),
    (lambda tmp, ds: gs.save_dataset(ds, None), ValueError, ["path=", "None"]),
    (lambda tmp, ds: gs.save_dataset(ds, 3), TypeError, ["path", "3"]),
    (lambda tmp, ds: gs.save_dataset(ds, ""), ValueError, ["path", "empty"]),
    (lambda tmp, ds: gs.save_dataset(str(tmp / "x.nc"), ds), ValueError, ["xarray.Dataset", "open_dataset"]),
    (lambda tmp, ds: gs.open_dataset(None), ValueError, ["path=", "None"]),
    (lambda tmp, ds: gs.open_dataset(0), TypeError, ["path", "file descriptor"]),
    (lambda tmp, ds: gs.to_chrome_trace(None), ValueError, ["xarray.Dataset as ds", "NoneType"]),
    (lambda tmp, ds: gs.to_chrome_trace(ds, path=7), TypeError, ["path", "7"]),
    (lambda tmp, ds: gs.to_chrome_trace(ds, metrics=[]), ValueError, ["metrics", "[]"]),
    (lambda tmp, ds: gs.to_chrome_trace(ds, metrics=[None]), TypeError, ["metrics", "None"]),
]


@pytest.mark.parametrize("call, exc, words", IO_BAD, ids=[str(i) for i in range(len(IO_BAD))])
def test_file_functions(tmp_path, timeseries, call, exc, words):
    with pytest.raises(exc) as info:
        call(tmp_path, timeseries)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing half written


@pytest.mark.parametrize(
    "check, args, exc, text",
    [
        (_validate.positive_int, (True, "n", None), TypeError, "n must be an integer at least 1; got True (bool)."),
        (_validate.positive_int, (np.int8(0), "n", 9), ValueError, "n must be an integer from 1 to 9; got 0."),
        (_validate.real, (NAN, "x"), ValueError, "x must be a finite number; got nan."),
        (_validate.duration, ("3 fortnights", "t"), ValueError, "Cannot read t='3 fortnights'"),
        (_validate.choice, (1, "c", [True, False]), ValueError, "c must be one of True, False; got 1."),
        (_validate.names, ("", "m"), ValueError, "m must name at least one item"),
        (_validate.path, (b"x.nc", "p"), TypeError, "p must be a file path (str or pathlib.Path); got b'x.nc'"),
    ],
)
def test_helpers_messages(check, args, exc, text):
    with pytest.raises(exc) as info:
        check(*args)
    assert str(info.value).startswith(text), str(info.value)


def test_helpers_normalise():
    assert _validate.duration("0.5 ms", "t") == 500_000
    assert _validate.duration(datetime.timedelta(microseconds=20), "t") == 20_000
    assert _validate.integer(np.uint16(7), "n") == 7 and type(_validate.integer(np.uint16(7), "n")) is int
    assert _validate.finite_positive_float(np.float32(0.25), "x") == 0.25
    assert _validate.names(("a", "b"), "m") == ["a", "b"]
    assert _validate.choice(True, "c", ["auto", True, False]) is True
