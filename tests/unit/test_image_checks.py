"""What the image checks trust, and the child process they run in (gpuscope/cupti/_images.py, _python.py): a verdict
holds for the bytes and the use that were tried, refusals are kept like passes, and a check that cannot run says
what failed instead of blaming the image. Crashes of CUPTI itself are in test_fuzz_images.py."""

import json
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuscope.cupti import _images, _python, pm_sampling
from gpuscope.errors import CounterDataImageError, ImageError

ROOT = Path(__file__).resolve().parents[2]
PM_IMAGE = ROOT / "tests" / "fixtures" / "pm" / "gh100_pm_default_counter_data.npz"
CONFIG = ROOT / "tests" / "fixtures" / "pm" / "gh100_pm_default_config.npy"
PM = _images.Kind.PM_SAMPLING


@pytest.fixture(scope="module")
def pm_image():
    return np.load(PM_IMAGE)["image"]


def check(image, chip=None, metrics=None):
    """The check every counter-data entry point makes (``count`` is asked only of images CUPTI made here)."""
    return _images.check(image, PM, count=None, chip=chip, metrics=metrics)


def test_a_verdict_covers_only_the_use_that_was_tried(child_checks, pm_image):
    image = pm_image.copy()
    check(image)  # the counts, as counter_data_info reads them: nothing evaluated
    check(image, "GH100", ["b", "a"])  # an evaluation: not covered by the counts
    check(image, "GH100", ["a", "b", "a"])  # the same metrics: covered
    check(image, "GH100", ["a"])  # other metrics
    check(image, "GA100", ["a"])  # another chip
    check(image)  # the counts again, and
    check(image.copy())  # the same bytes elsewhere: covered
    size = image.size
    assert child_checks == [("pm_sampling", None, (), None, size), ("pm_sampling", "GH100", ("a", "b"), None, size),
                            ("pm_sampling", "GH100", ("a",), None, size), ("pm_sampling", "GA100", ("a",), None, size)]


def test_an_evaluation_that_passed_covers_the_counts(child_checks, pm_image):
    image = pm_image.copy()
    check(image, "GH100", ["a"])
    assert check(image)[1] == _images.ImageInfo(PM, 1) and len(child_checks) == 1


def test_cupti_reads_a_private_copy_and_trust_ends_when_the_bytes_change(child_checks, pm_image):
    image = pm_image.copy()
    read, _ = check(image, "GH100", ["a"])
    assert read is not image and not read.flags.writeable and np.array_equal(read, pm_image)
    image[100] ^= 0xFF  # np.copyto of another image into the same buffer, say
    again, _ = check(image, "GH100", ["a"])
    assert len(child_checks) == 2  # the changed bytes are checked anew
    assert read[100] == pm_image[100] and again[100] == image[100]  # each call reads what was checked


def test_refusals_are_kept_by_content_and_use(child_checks, pm_image):
    refused = _images._Refused(CounterDataImageError, ": CUPTI crashed reading it")
    image = pm_image.copy()
    child_checks.answer = lambda image, kind: refused
    for _ in range(2):
        with pytest.raises(CounterDataImageError, match="^image: CUPTI crashed reading it$"):
            _images.check(image.copy(), PM, count=None, chip="GH100", metrics=["a"], what="image")
    assert len(child_checks) == 1
    child_checks.answer = lambda image, kind: _images.ImageInfo(kind, 5)
    assert check(image)[1].count == 5 and len(child_checks) == 2  # an evaluation refused: the counts may be fine
    other = image.copy()
    other[200] ^= 0xFF
    child_checks.answer = lambda image, kind: refused
    with pytest.raises(CounterDataImageError):
        check(other)
    with pytest.raises(CounterDataImageError):  # the counts refused: so is every use, without another child
        check(other, "GH100", ["a"])
    assert len(child_checks) == 3


def test_a_refused_image_starts_one_child_only(monkeypatch, pm_image):
    monkeypatch.setattr(_images, "_verdicts", {})
    started = []
    real = _images._check_in_child
    monkeypatch.setattr(_images, "_check_in_child", lambda *args, **kw: started.append(1) or real(*args, **kw))
    truncated = pm_image[:100_000].copy()
    messages = []
    for _ in range(3):
        with pytest.raises(CounterDataImageError) as caught:
            pm_sampling.counter_data_info(truncated)
        messages.append(str(caught.value))
    assert len(started) == 1 and messages[0] == messages[2] and "CUPTI crashed" in messages[0]


@pytest.mark.parametrize("executable,why", [
    ("", "sys.executable is empty"),
    ("/nonexistent/python", r"sys.executable \(/nonexistent/python\) is not an executable file"),
    (shutil.which("true"), r"sys.executable \(.*/true\) is not a Python interpreter"),
])
def test_no_interpreter_is_said_never_blamed_on_the_image(monkeypatch, pm_image, executable, why):
    monkeypatch.setattr(_images, "_verdicts", {})
    monkeypatch.setattr(sys, "executable", executable)
    monkeypatch.delenv(_python.ENV_VAR, raising=False)
    with pytest.raises(CounterDataImageError, match=f"could not be checked before CUPTI reads it: the child process "
                                                    f"that checks it could not be started: {why}.*was not judged"):
        pm_sampling.counter_data_info(pm_image.copy())
    with pytest.raises(ImageError, match=why):  # a config image: the same
        _images.check_flat(np.load(CONFIG), _images.Kind.CONFIG, what="config", known_chips=lambda: ["GH100"])
    assert _images._verdicts == {}  # nothing was judged, so nothing is kept


def test_a_frozen_app_is_never_started_as_the_checking_child(monkeypatch, pm_image):
    monkeypatch.setattr(_images, "_verdicts", {})
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.delenv(_python.ENV_VAR, raising=False)
    started = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kw: started.append(args))
    with pytest.raises(CounterDataImageError, match="this is a frozen application: sys.executable .* is the "
                                                    "application, not a Python interpreter; set GPUSCOPE_PYTHON"):
        pm_sampling.counter_data_info(pm_image.copy())
    assert started == []


def test_gpuscope_python_names_the_interpreter(monkeypatch, pm_image):
    interpreter = sys.executable
    monkeypatch.setattr(_images, "_verdicts", {})
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/app/app")
    monkeypatch.setenv(_python.ENV_VAR, interpreter)
    assert _python.interpreter() == interpreter
    assert pm_sampling.counter_data_info(pm_image.copy()).completed == 261  # checked in a real child
    monkeypatch.setenv(_python.ENV_VAR, "/nonexistent/python")
    with pytest.raises(OSError, match=r"GPUSCOPE_PYTHON \(/nonexistent/python\) is not an executable file"):
        _python.interpreter()


def test_the_guard_fits_the_address_space_limit():
    full, reserve, page = _images.GUARD_BYTES, _images.CHILD_RESERVE_BYTES, 4096
    assert _images.guard_bytes(10_000, None, 500 << 20) == full
    assert _images.guard_bytes(400 << 20, None, 0) == 1600 << 20  # at least four times the image
    limit = 1_500_000 * 1024  # ulimit -v 1500000
    guard = _images.guard_bytes(10_000, limit, 450 << 20)
    assert guard == (limit - (450 << 20) - 3 * page - reserve) // page * page and guard < full
    assert _images.guard_bytes(10_000, 8 << 30, 450 << 20) == full
    with pytest.raises(MemoryError, match=r"the address-space limit \(ulimit -v: 600 MiB\) leaves 21 MiB for the "
                                          r"guard .* less than the 64 MiB the check needs"):
        _images.guard_bytes(1 << 20, 600 << 20, 450 << 20)


UNDER_LIMIT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]) * 1024,) * 2)  # ulimit -v, inherited by the child
    from gpuscope.cupti import _images, host, pm_sampling
    from gpuscope.cupti._types import ProfilerType
    from gpuscope.errors import CounterDataImageError
    image = np.load(sys.argv[1])["image"]
    try:
        completed = pm_sampling.counter_data_info(image).completed
        with host.ProfilerHost("GH100", ProfilerType.PM_SAMPLING) as h:
            values = np.empty((completed, 1))
            h.evaluator(["gr__cycles_active.avg.pct_of_peak_sustained_elapsed"]).evaluate_into(image, 0, completed, values)
        print(json.dumps({"completed": completed}))
    except CounterDataImageError as exc:
        print(json.dumps({"error": str(exc), "kept": len(_images._verdicts)}))
""")


def under_address_limit(kib: int) -> dict:
    out = subprocess.run([sys.executable, "-c", UNDER_LIMIT, str(PM_IMAGE), str(kib)], capture_output=True,
                         text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY, reason="a limit is set")
def test_a_sound_image_passes_under_ulimit_v():
    assert under_address_limit(1_500_000) == {"completed": 261}


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY, reason="a limit is set")
def test_an_address_space_too_small_for_the_check_is_said_and_not_kept():
    answer = under_address_limit(650_000)
    assert answer["kept"] == 0, answer
    assert answer["error"].startswith("image could not be checked before CUPTI reads it: MemoryError: the "
                                      "address-space limit (ulimit -v: 634 MiB) leaves "), answer
    assert answer["error"].endswith("; raise the limit. The pm_sampling counter-data image was not judged (it may well "
                                    "be sound), and CUPTI has not read it."), answer


def test_a_finalizer_that_runs_while_the_trust_lock_is_held_does_not_deadlock():
    """A garbage collection inside ``is_trusted`` (at ``image.ctypes``) ran another image's ``_forget`` on the same
    thread while the lock was held: with a plain Lock the GPU suite hung there (test_found_iterations, H200)."""
    import threading

    from gpuscope.cupti import _images

    def body():
        with _images._lock:
            _images._forget((0, 0))  # as a weakref finalizer run by a collection on this thread would

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive()
