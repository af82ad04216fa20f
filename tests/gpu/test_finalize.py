"""cuptiFinalize on the GPU (issue 36 item 5): gpuscope's detach finalizes CUPTI in the exit callback of the detaching
thread's own driver call, beside another thread calling the driver; another client's cuptiFinalize is seen before
gpuscope reuses its subscriber or kept profiler, and the next session starts afresh with the same values. Each test
runs in a fresh process (what CUPTI knows of a process is the subject)."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import ctypes, json, threading, warnings
import gpuscope as gs
from gpuscope._gpu import keep
from gpuscope.cupti import _api, callbacks, profiler, subscriber
from benchmarks import bench_pc_sampling as B
ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
work = B.Workload()

def session():
    with gs.Profiler(ONE_PASS, mode="user") as prof:
        with gs.range("r"):
            work.run(2)
    ds = prof.dataset
    return {m: float(ds[m].values.sum()) for m in ONE_PASS}

finalizes = []  # (on the detaching thread, inside its call's exit callback)
_api.observe(lambda name, seconds: finalizes.append([threading.get_ident() == MAIN, subscriber._exit_call is not None])
             if name == "cuptiFinalize" else None)
MAIN = threading.get_ident()
"""


def _run(body: str) -> dict:
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_detach_finalizes_in_the_exit_callback_of_its_own_call_and_pc_sampling_gets_every_kernel():
    got = _run("""
        with gs.Profiler("launch", mode="kernel"):
            work.run(2)  # both kernels run under range profiling first
        outcome = keep.detach_cupti()
        with gs.pc_sample(period=2**10, kernels=[B.stream, B.fma]) as s:
            work.run(10)
        ds = s.dataset
        print(json.dumps({"outcome": outcome, "finalizes": finalizes, "unattributed": ds.attrs["non_user_kernel_samples"],
                          "kernels": sorted(str(k).rsplit(".", 1)[-1] for k in ds.kernel.values)}))
    """)
    assert got["outcome"] == "detached", got
    # on this thread, inside the callback of its own call (the block detaches again: the module watcher, resumed
    # after the first detach, attached CUPTI once more)
    assert got["finalizes"] and all(f == [True, True] for f in got["finalizes"]), got
    assert got["unattributed"] == 0 and got["kernels"] == ["fma", "stream"], got


def test_a_detach_beside_a_thread_that_calls_the_driver_finalizes_only_at_its_own_call():
    """Another thread calls cuCtxGetCurrent, the detach's own function, all along: five detaches, each finalized
    once, on the detaching thread; the other thread goes on without an error."""
    got = _run("""
        from cuda.bindings import driver
        stop, calls, errors = threading.Event(), [0], []
        def busy():
            try:
                while not stop.is_set():
                    driver.cuCtxGetCurrent()
                    calls[0] += 1
            except Exception as exc:
                errors.append(repr(exc))
        other = threading.Thread(target=busy)
        other.start()
        outcomes = []
        for _ in range(5):
            session()
            outcomes.append(keep.detach_cupti())
        stop.set()
        other.join(60)
        print(json.dumps({"outcomes": outcomes, "finalizes": finalizes, "calls": calls[0], "errors": errors,
                          "alive": other.is_alive()}))
    """)
    assert got["outcomes"] == ["detached"] * 5, got
    assert got["finalizes"] == [[True, True]] * 5, got
    assert got["calls"] > 0 and got["errors"] == [] and not got["alive"], got


def test_cupti_names_gpuscope_while_it_holds_the_subscriber():
    """What tells gpuscope that CUPTI still knows its subscriber: a second subscribe is refused, naming gpuscope."""
    got = _run("""
        profiler.initialize()  # holds the subscriber
        status, who, handle, callback = subscriber._try_subscribe()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            known = callbacks.known()
        profiler.deinitialize()
        print(json.dumps({"status": status, "who": who, "known": known, "held": bool(subscriber._subscription)}))
    """)
    assert got["status"] == 39 and "gpuscope" in got["who"], got
    assert got["known"] and not got["held"], got


def test_another_clients_finalize_while_a_profiler_is_kept_leaves_the_next_sessions_right():
    """Another client (here a direct call into libcupti, as an older Kineto's teardown made) finalizes CUPTI while
    gpuscope keeps a range profiler (and, since nothing of gpuscope's is open, holds no subscriber, so it cannot see
    it): the next sessions count what the first did. On the H100 (CUPTI 13.0) the kept profiler served on without a
    word; where CUPTI refuses it, the session says so once and sets up afresh (Profiler._start_first)."""
    got = _run("""
        first = session()
        kept = keep.kept_devices()
        lib = ctypes.CDLL(_api.library().path)
        lib.cuptiFinalize.restype = ctypes.c_int
        from numba import cuda
        cuda.synchronize()
        status = lib.cuptiFinalize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            second = session()
            third = session()
        said = [str(w.message)[:60] for w in caught if "finalized CUPTI" in str(w.message)]
        print(json.dumps({"first": first, "second": second, "third": third, "kept": kept, "status": status,
                          "said": said, "kept_after": keep.kept_devices()}))
    """)
    assert got["kept"] == [0] and got["status"] == 0, got
    assert len(got["said"]) <= 1, got
    assert got["second"] == got["first"] == got["third"], got
    assert got["kept_after"] == [0], got


def test_a_host_object_works_after_a_finalize():
    """gpuscope keeps its host objects (config images, evaluation) across another client's cuptiFinalize: the host
    API needs no GPU and no attached CUPTI. Checked here: the same config image before and after."""
    got = _run("""
        from gpuscope.cupti import host
        from gpuscope.cupti._types import ProfilerType
        profiler.initialize()
        chip = profiler.chip_name(0)
        profiler.deinitialize()
        h = host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER)
        h.add_metrics(ONE_PASS)
        before = bytes(h.config_image())
        session()
        keep.release()
        lib = ctypes.CDLL(_api.library().path)
        lib.cuptiFinalize.restype = ctypes.c_int
        status = lib.cuptiFinalize()
        after = bytes(h.config_image())
        again = session()
        print(json.dumps({"status": status, "same": before == after, "again": again}))
    """)
    assert got["status"] == 0 and got["same"], got
    assert all(v > 0 for v in got["again"].values()), got
