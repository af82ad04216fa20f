"""Probe: where two cost regressions of issue 52 come from (items 13 and 14), measured on the GPU.

Item 14: a warm kernel-mode Top-Down session repeated cost 0.16 s on an H200, 0.09 s before (user range, one-pass
kernel and PM sessions unchanged). Item 13: PM sampling (``pm-fast`` at 20 us) over a launch-bound CuPy loop with
``gs.range`` spans cost +5.8% to +21% over the plain loop, +0.27% before; decoding 12.3 us a sample, 9.1 before.

Run on the GPU machine from the repository root (about 2 minutes; ``--quick`` about 1)::

    source tests/gpu/device_env.sh
    python3 probes/probe_cost_regressions.py --out $OUT/cost_regressions
    python3 probes/probe_cost_regressions.py --out $OUT/cost_regressions --quick
    python3 probes/probe_cost_regressions.py --only topdown          # or pm

Each part runs in processes of its own (``--child NAME``, which write ``child_<NAME>.json`` under ``--out`` after
every case, so a killed child keeps what it measured); the parent writes ``probe_cost_regressions.json`` and the
cProfile listing ``topdown_cprofile.txt`` there, prints that listing, then a summary table. Every case runs in a
``try``: one that fails is reported, the others go on. Suspects are switched off from the outside (monkeypatching
gpuscope's functions in the child), never by editing gpuscope.

``topdown`` (item 14): the workload of ``bench_session_cost.py``'s ``kernel`` mode (one launch of its 0.5 ms FMA
kernel) in kernel-mode ``gs.Profiler("topdown")`` sessions, each timed by stage (enter, body, exit, Dataset,
``gs.topdown``), with ``time.perf_counter`` around the suspected functions and CUPTI's calls (``_api.observe``).
First, sessions whose replay-cost check asks NVML as gpuscope did before 69e3031 (``nvmlInit``, query,
``nvmlShutdown`` at every session's close), while nothing else has NVML initialised; then interleaved rounds of: as
committed; no graph watcher (``graph_nodes.watch`` a no-op: no CUPTI graph callbacks); no module watcher; no
replay-cost check (NVML and ``cuMemGetInfo``); no stream-capture query at each launch; all four off; and as committed
over three launches (the FMA kernel and two CuPy kernels). Then three sessions under cProfile (top 25 by cumulative
time), a one-pass kernel-mode session for reference, and each suspect alone, timed outside sessions.

``pm_late`` and ``pm_early`` (item 13): a CuPy loop of 4 launches a step on 64 KiB arrays (launch-bound), with two
``gs.range`` a step ("step" and "step/inner") or none, for ``--case-seconds`` per case, the cases interleaved
``--reps`` times; "% over plain" is against the plain loop of the same repetition. ``pm_late`` makes gpuscope's NVTX
domain at its first range, as gpuscope did before 69e3031 (from ca0cfa0 on): that first range comes inside the first
PM session, with CUPTI attached; cases: plain, PM with ranges, ranges without a session, PM without ranges, PM with
ranges and the sampler's span recording switched off, PM with ranges and gpuscope's NVTX calls switched off (what
69e3031 does where no tool is attached), PM with ranges decoding every 50 ms instead of 10. ``pm_early`` makes the
domain before CUDA starts, as gpuscope did at import before ca0cfa0 (NVTX then starts with no tool: no-ops); cases:
plain, PM with ranges, ranges without a session, PM without ranges, and the Numba loop of
``bench_pm_sampling.py`` (the workload of the +0.27% figure) plain and sampled. Both children time NVTX push/pop
pairs on gpuscope's domain, say its class (the ``nvtx`` package gives a ``DummyDomain`` of Python no-ops where no
tool took NVTX at its first call, a ``Domain`` where one did) and count how many of 100 pairs CUPTI's NVTX callbacks
hear (:class:`gpuscope.cupti.nvtx.NvtxWatcher`): heard without ``NVTX_INJECTION64_PATH`` means NVTX reached CUPTI
through the driver.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILDREN = {"topdown": ("topdown",), "pm": ("pm_late", "pm_early"), "all": ("topdown", "pm_late", "pm_early")}
#: How long each child may run at most (s), before the overall budget cuts it shorter.
CHILD_CAP_S = {"topdown": 60, "pm_late": 75, "pm_early": 70}
MISSING = object()


# -- helpers shared by the children ---------------------------------------------------------------------------------
def patch(owner, name: str, value):
    """Set ``owner.name`` (a module or a class) to *value*; returns the undo. A class attribute inherited from a mixin
    is set on *owner* and deleted again."""
    before = owner.__dict__.get(name, MISSING) if isinstance(owner, type) else getattr(owner, name, MISSING)

    def undo():
        if before is MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, before)

    setattr(owner, name, value)
    return undo


class Timers:
    """Seconds and calls per label, of functions wrapped from the outside (:meth:`wrap`); :meth:`take` per session."""

    def __init__(self):
        self.seconds, self.calls, self.missing, self._undo = {}, {}, [], []

    def wrap(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name, MISSING)
        if original is MISSING or not callable(original):
            self.missing.append(label)
            return

        @functools.wraps(original)
        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - began
                self.calls[label] = self.calls.get(label, 0) + 1

        self._undo.append(patch(owner, name, timed))

    def take(self) -> dict:
        out = {k: [round(v * 1e3, 3), self.calls[k]] for k, v in self.seconds.items()}
        self.seconds.clear()
        self.calls.clear()
        return out


def imported(path: str):
    """The module or class at dotted *path* (``gpuscope.cupti.callbacks.LaunchRecorder``), or None."""
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


class Results:
    """A child's results, written to ``child_<name>.json`` after every case (a killed child keeps them)."""

    def __init__(self, out: Path, name: str, deadline: float):
        self.path, self.deadline = out / f"child_{name}.json", deadline
        self.data = {"child": name, "cases": [], "notes": {}, "errors": []}

    def time_left(self) -> float:
        return self.deadline - time.time()

    def add(self, case: dict) -> None:
        self.data["cases"].append(case)
        self.save()

    def note(self, key: str, value) -> None:
        self.data["notes"][key] = value
        self.save()

    def error(self, what: str, exc: BaseException) -> None:
        self.data["errors"].append(" ".join(f"{what}: {type(exc).__name__}: {exc}".split())[:600])
        print(f"[{self.data['child']}] {what} failed:\n{traceback.format_exc(limit=6)}", file=sys.stderr, flush=True)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def environment() -> dict:
    """What decides the suspects' cost: the packages' versions, NVML's binding, the variables that attach a tool."""
    import importlib.metadata
    import importlib.util

    out = {}
    for package in ("cuda-bindings", "cupy-cuda13x", "cupy-cuda12x", "nvtx", "numba-cuda"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        out["cuda.bindings.nvml"] = importlib.util.find_spec("cuda.bindings.nvml") is not None
    except ImportError:
        out["cuda.bindings.nvml"] = False
    out.update({name: os.environ.get(name, "") for name in ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")})
    return out


def log(child: str, text: str) -> None:
    print(f"[{child} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- item 14: the warm kernel-mode Top-Down session -----------------------------------------------------------------
def old_process_memory_gib(index: int = 0):
    """gpuscope._gpu.device.process_memory_gib as it was before 69e3031: NVML initialised and shut down per call."""
    from cuda.bindings import nvml

    from gpuscope._gpu import device

    try:
        nvml.init_v2()
    except Exception:
        return None
    try:
        handle = nvml.device_get_handle_by_pci_bus_id_v2(device.device_info(index).pci_bus_id)
        infos = nvml.device_get_compute_running_processes_v3(handle)
        for i in range(len(infos)):
            if int(infos[i].pid) == os.getpid():
                return int(infos[i].used_gpu_memory) / 2**30
        return None
    except Exception:
        return None
    finally:
        try:
            nvml.shutdown()
        except Exception:
            pass


def topdown_session(gs, body, sync, metrics="topdown") -> dict:
    """One kernel-mode session around *body*: seconds per stage, as bench_session_cost.session measures them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        prof = gs.Profiler(metrics, mode="kernel", progress=False)
        with prof:  # closed whatever the body raises: the next session must find the device free
            t1 = time.perf_counter()
            body()
            sync()
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        ds = prof.dataset
        t4 = time.perf_counter()
        if metrics == "topdown":
            gs.topdown(ds)
        t5 = time.perf_counter()
    stages = dict(enter=t1 - t0, body=t2 - t1, exit=t3 - t2, dataset=t4 - t3, analysis=t5 - t4, total=t5 - t0)
    out = {k: round(v * 1e3, 2) for k, v in stages.items()}
    out.update(rows=int(ds.sizes.get("range", 0)), reused=int(ds.attrs.get("profiler_reused", 0)),
               replay_ms=ds.attrs.get("replay_ms_per_launch"), warnings=len(caught))
    return out


def child_topdown(args, res: Results) -> None:
    import gpuscope as gs
    from gpuscope._gpu import device as _device
    from gpuscope._gpu import graph_nodes as _graph_nodes
    from gpuscope._gpu import modules as _modules
    from gpuscope._range_profiling import launches as _launches

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_session_cost import ONE_PASS, Calls, _kernel

    name = "topdown"
    launch, sync = _kernel()
    import cupy as cp

    a = cp.ones(1 << 20, cp.float32)

    def three():  # the FMA kernel and two CuPy kernels
        launch()
        cp.multiply(a, 1.0001, out=a)
        cp.add(a, 0.5, out=a)

    three()
    sync()
    calls = Calls()
    timers = Timers()
    Profiler = gs.Profiler
    for owner, attr, label in [
        (_graph_nodes, "watch", "graph watcher on"), (_graph_nodes, "pause", "graph watcher off"),
        (_modules, "watch", "module watcher on"), (_modules, "pause", "module watcher off"),
        (imported("gpuscope.cupti.graphs.GraphWatcher"), "_on_callback", "graph callbacks heard"),
        (imported("gpuscope.cupti.callbacks.LaunchRecorder"), "__init__", "launch recorder open"),
        (imported("gpuscope.cupti.callbacks.LaunchRecorder"), "close", "launch recorder close"),
        (imported("gpuscope.cupti.subscriber") or imported("gpuscope.cupti.callbacks"), "known", "subscriber known()"),
        (Profiler, "_on_enter", "launch entry callback"), (Profiler, "_on_exit", "launch exit callback"),
        (_launches, "capturing", "stream capture query"),
        (Profiler, "_configure", "configure (kept profiler)"), (Profiler, "_start_first", "first Start"),
        (Profiler, "_hold_counters", "hold counters (rendezvous)"),
        (Profiler, "_stop_kernel_pass", "stop pass"), (Profiler, "_collect_kernels", "decode + evaluate"),
        (Profiler, "_warn_replay_cost", "replay-cost check"), (_device, "process_memory_gib", "NVML process memory"),
        (_device, "memory_used_gib", "cuMemGetInfo device memory"),
        (Profiler, "_note_graph_launches", "graph launch notes"), (Profiler, "_report_selection", "report selection"),
        (Profiler, "_teardown", "teardown (keep)"), (imported("gpuscope._results.build"), "range_dataset", "Dataset"),
    ]:
        if owner is None:
            timers.missing.append(label)
        else:
            timers.wrap(owner, attr, label)
    res.note("timers_missing", timers.missing)
    res.note("environment", environment())

    def run(variant: str, body=launch, metrics="topdown") -> None:
        try:
            case = {"variant": variant, **topdown_session(gs, body, sync, metrics)}
        except Exception as exc:
            res.error(f"session {variant}", exc)
            return
        case["timers"] = timers.take()
        case["cupti"] = calls.take()
        res.add(case)

    # 1. NVML asked per session as before 69e3031, while nothing else holds NVML initialised (the cold session too)
    undo = patch(_device, "process_memory_gib", old_process_memory_gib)
    timers.wrap(_device, "process_memory_gib", "NVML process memory")
    try:
        run("cold (NVML per call)")
        for _ in range(args.sessions):
            run("NVML per call (before 69e3031)")
        samples = []
        for _ in range(3):
            began = time.perf_counter()
            old_process_memory_gib(0)
            samples.append(round((time.perf_counter() - began) * 1e3, 2))
        res.note("alone: NVML init+query+shutdown", samples)
    except Exception as exc:
        res.error("NVML per call", exc)
    finally:
        undo()
    timers.take()
    calls.take()
    log(name, "NVML-per-call sessions done")

    # 2. interleaved rounds, each suspect switched off from the outside
    def no_graphs():
        return patch(_graph_nodes, "watch", lambda keep=False, strict=False: "switched off by the probe")

    def no_modules():
        return patch(_modules, "watch", lambda: _modules.seen())

    def no_cost_check():
        return patch(Profiler, "_warn_replay_cost", lambda self, *a, **k: None)

    def no_capture_query():
        return patch(_launches, "capturing", lambda stream: False)

    def all_off():
        undos = [no_graphs(), no_modules(), no_cost_check(), no_capture_query()]
        return lambda: [u() for u in reversed(undos)]

    variants = [("as committed", None, launch), ("no graph watcher", no_graphs, launch),
                ("no module watcher", no_modules, launch), ("no replay-cost check", no_cost_check, launch),
                ("no capture query", no_capture_query, launch), ("all four off", all_off, launch),
                ("as committed, 3 launches", None, three)]
    for round_ in range(args.sessions):
        if res.time_left() < 8:
            res.note("rounds_cut", f"after {round_} of {args.sessions}: out of time")
            break
        for variant, off, body in variants:
            undo = off() if off is not None else None
            try:
                run(variant, body)
            finally:
                if undo is not None:
                    undo()
    log(name, "interleaved rounds done")

    # 3. cProfile of three warm sessions as committed
    if res.time_left() > 5:
        try:
            import cProfile
            import io
            import pstats

            profile = cProfile.Profile()
            profile.enable()
            for _ in range(3):
                topdown_session(gs, launch, sync)
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
            res.note("cprofile", text.getvalue())
        except Exception as exc:
            res.error("cProfile", exc)
        timers.take()
        calls.take()

    # 4. each suspect alone, outside sessions (the subscriber is given back between sessions: each cycle subscribes)
    def timed(what: str, fn, n: int = 5) -> None:
        try:
            samples = []
            for _ in range(n):
                began = time.perf_counter()
                fn()
                samples.append(round((time.perf_counter() - began) * 1e3, 3))
            res.note(what, samples)
        except Exception as exc:
            res.error(what, exc)

    timed("alone: process_memory_gib as committed", lambda: _device.process_memory_gib(0), 3)
    timed("alone: memory_used_gib", lambda: _device.memory_used_gib(0), 3)
    timed("alone: graph watcher on+off", lambda: (_graph_nodes.watch(), _graph_nodes.pause()))
    timed("alone: module watcher on+off", lambda: (_modules.watch(), _modules.pause()))
    recorder = imported("gpuscope.cupti.callbacks.LaunchRecorder")
    if recorder is not None:
        timed("alone: launch recorder open+close", lambda: recorder(lambda launch: None).close())

    # 5. a one-pass kernel-mode session for reference (another configuration: the first enables a new profiler)
    if res.time_left() > 5:
        for _ in range(4):
            run("one-pass kernel", launch, list(ONE_PASS))
    timers.take()


# -- item 13: PM sampling over a launch-bound CuPy loop with ranges -------------------------------------------------
def old_domain():
    """gpuscope._range_profiling.ranges._domain from ca0cfa0 to 69e3031: the nvtx package's domain at the first range,
    whatever the environment."""
    from gpuscope._range_profiling import ranges

    if ranges._DOMAIN is ranges._UNSET:
        try:
            import nvtx

            ranges._DOMAIN = nvtx.get_domain("gpuscope")
        except Exception:
            ranges._DOMAIN = None
    return ranges._DOMAIN


def cupy_loop(gs):
    """``loop(seconds, ranges) -> us per step``: 4 CuPy launches a step on 64 KiB arrays, with ("step", then "inner"
    inside it) or without ranges, synchronised every 64 steps (benchmarks/bench_pm_launch_bound.py's loop, which
    grew out of this one)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_pm_launch_bound import cupy_loop as loop

    return loop(gs)


def numba_loop():
    """``loop(seconds, ranges) -> us per launch``: bench_pm_sampling's Numba loop (no ranges), the +0.27% workload."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_pm_sampling

    _, for_seconds, _, _ = bench_pm_sampling.make_workload()

    def loop(seconds: float, ranges: bool) -> float:
        launches, took = for_seconds(seconds)
        return took / launches * 1e6

    return loop


def sampled(gs, loop, seconds: float, ranges: bool, decode_period: float = 0.01) -> dict:
    """The loop inside ``gs.sample("pm-fast", interval="20us")``: its time, and what the pipeline says."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        began = time.perf_counter()
        with gs.sample("pm-fast", interval="20us", decode_period=decode_period) as s:
            entered = time.perf_counter()
            us = loop(seconds, ranges)
            left = time.perf_counter()
        done = time.perf_counter()
    decoder = getattr(s, "_decoder", None)
    decoded = getattr(decoder, "decoded_samples", 0)
    recorder = getattr(s, "_recorder", None)
    return {"us": round(us, 3), "decode_us_per_sample": round(decoder.decode_seconds / decoded * 1e6, 2)
            if decoded else None, "samples": decoded, "decodes": getattr(decoder, "decodes", None),
            "lost": getattr(s, "lost_samples", None), "discarded": getattr(decoder, "discarded", None),
            "overflows": getattr(decoder, "overflows", None), "reused": bool(getattr(s, "reused", False)),
            "spans": len(recorder.events) // 2 if recorder is not None else None,
            "enter_ms": round((entered - began) * 1e3, 1), "exit_ms": round((done - left) * 1e3, 1),
            "warnings": [str(w.message)[:160] for w in caught][:3]}


def nvtx_checks(res: Results, when: str, watch: bool = True) -> None:
    """NVTX push/pop pairs on gpuscope's domain: their cost, and (*watch*) how many of 100 CUPTI's NVTX callbacks
    hear."""
    from gpuscope._range_profiling import ranges

    domain = ranges._DOMAIN
    if domain is None or domain is ranges._UNSET:
        res.note(f"nvtx_{when}", "no gpuscope NVTX domain (no nvtx package?)")
        return
    try:
        attributes = domain.get_event_attributes(message="probe")
        began = time.perf_counter()
        for _ in range(20000):
            domain.push_range(attributes)
            domain.pop_range()
        pair_ns = (time.perf_counter() - began) / 20000 * 1e9
        # the nvtx package gives a DummyDomain (pure Python no-ops) where no tool took NVTX at its first call
        found = {"domain": type(domain).__name__, "pair_ns": round(pair_ns, 1)}
        if watch:
            from gpuscope.cupti.nvtx import NvtxWatcher

            heard = []
            watcher = NvtxWatcher(heard.append)
            try:
                for _ in range(100):
                    ranges._emit(True, "probe")
                    ranges._emit(False)
            finally:
                watcher.close()
            found["cupti_heard_of_200"] = len(heard)
        res.note(f"nvtx_{when}", found)
    except Exception as exc:
        res.error(f"NVTX check {when}", exc)


def child_pm(args, res: Results) -> None:
    name = args.child
    import gpuscope as gs
    from gpuscope._pm_sampling import timeline as _timeline
    from gpuscope._range_profiling import ranges as _ranges

    res.note("environment", environment())
    _ranges._DOMAIN = _ranges._UNSET
    patch(_ranges, "_domain", old_domain)  # the NVTX of ca0cfa0..69e3031, whatever the environment
    if name == "pm_early":
        old_domain()  # before CUDA and CUPTI, as gpuscope's import did before ca0cfa0
        nvtx_checks(res, "before_cuda", watch=False)
    loop = cupy_loop(gs)
    seconds = args.case_seconds

    def no_spans():
        undos = [patch(_timeline.RangeRecorder, m, lambda self, path: None) for m in ("range_push", "range_pop")]
        return lambda: [u() for u in undos]

    def no_nvtx():
        return patch(_ranges, "_emit", lambda push, path="": None)

    # (label, inside a PM session, what it switches off, options: ranges (default: with PM), numba, decode_period)
    cases = [("plain", False, None, {}), ("PM, ranges", True, None, {}),
             ("ranges, no session", False, None, {"ranges": True}), ("PM, no ranges", True, None, {"ranges": False})]
    if name == "pm_late":
        cases += [("PM, ranges, no span recording", True, no_spans, {}),
                  ("PM, ranges, no NVTX (69e3031)", True, no_nvtx, {}),
                  ("PM, ranges, decode every 50 ms", True, None, {"decode_period": 0.05})]
    numba = None
    if name == "pm_early" and not args.quick:
        try:
            numba = numba_loop()
        except Exception as exc:
            res.error("Numba workload", exc)
    if numba is not None:
        cases += [("Numba loop, plain", False, None, {"numba": True}), ("Numba loop, PM", True, None, {"numba": True})]
    need = len(cases) * (seconds + 0.6)
    for rep in range(args.reps):
        if rep and res.time_left() < need:
            res.note("reps_cut", f"after {rep} of {args.reps}: out of time")
            break
        for label, pm, off, extra in cases:
            if res.time_left() < seconds + 3:
                res.note("cases_cut", f"rep {rep}, from {label!r}: out of time")
                break
            ranges = extra.get("ranges", pm)
            work = numba if extra.get("numba") else loop
            undo = off() if off is not None else None
            try:
                if pm:
                    case = sampled(gs, work, seconds, ranges and not extra.get("numba"),
                                   extra.get("decode_period", 0.01))
                else:
                    case = {"us": round(work(seconds, ranges and not extra.get("numba")), 3)}
                res.add({"case": label, "rep": rep, **case})
            except Exception as exc:
                res.error(f"{label} (rep {rep})", exc)
            finally:
                if undo is not None:
                    undo()
            if rep == 0 and label == "PM, ranges":
                nvtx_checks(res, "after_first_session")
        log(name, f"rep {rep} done")


# -- the parent: children, JSON, summary ------------------------------------------------------------------------------
def run_children(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = {"args": vars(args), "children": {}}
    for child in CHILDREN[args.only]:
        left = args.budget - (time.time() - started) - 3
        if left < 15:
            results["children"][child] = {"errors": [f"not run: {left:.0f} s of the budget left"]}
            continue
        timeout = min(CHILD_CAP_S[child] * (0.6 if args.quick else 1.0), left)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", child, "--out", str(out),
               "--deadline", str(time.time() + timeout - 4), "--case-seconds", str(args.case_seconds),
               "--reps", str(args.reps), "--sessions", str(args.sessions)] + (["--quick"] if args.quick else [])
        path = out / f"child_{child}.json"
        path.unlink(missing_ok=True)
        began = time.time()
        note = ""
        try:
            rc = subprocess.run(cmd, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
            if rc:
                note = f"exit status {rc}"
        except subprocess.TimeoutExpired:
            note = f"killed after {timeout:.0f} s (what it had measured is kept)"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            data = {"cases": [], "notes": {}, "errors": [f"no results file ({exc})"]}
        if note:
            data.setdefault("errors", []).append(note)
        data["wall_s"] = round(time.time() - began, 1)
        results["children"][child] = data
    results["wall_s"] = round(time.time() - started, 1)
    (out / "probe_cost_regressions.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def _median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def _fmt(value, digits=1, width=7) -> str:
    return f"{value:{width}.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


def summary_topdown(data: dict) -> list[str]:
    lines = ["item 14: warm kernel-mode Top-Down session, bench_session_cost's 1 launch; ms, median of warm sessions"]
    if not data.get("cases"):
        return lines + [f"  no session: {'; '.join(data.get('errors', []))[:200]}"]
    by = {}
    for case in data["cases"]:
        by.setdefault(case["variant"], []).append(case)
    lines.append(f"  {'variant':<32} {'total':>7} {'enter':>7} {'body':>7} {'exit':>7} {'dataset':>7} {'topdown':>7}"
                 f" {'replay':>7}  n")
    for variant, cases in by.items():
        warm = cases[1:] if variant == "one-pass kernel" and len(cases) > 1 else cases  # its first enables a profiler
        row = [_median([c.get(k) for c in warm]) for k in ("total", "enter", "body", "exit", "dataset", "analysis",
                                                            "replay_ms")]
        lines.append(f"  {variant:<32} " + " ".join(_fmt(v) for v in row) + f"  {len(warm)}")
    for variant in ("NVML per call (before 69e3031)", "as committed"):
        cases = by.get(variant, [])
        if not cases:
            continue
        spent = {}
        for case in cases:
            for label, (ms, _n) in case.get("timers", {}).items():
                spent.setdefault(label, []).append(ms)
        top = sorted(((statistics.mean(v), k) for k, v in spent.items()), reverse=True)[:7]
        lines.append(f"  in '{variant}', ms/session: " + ", ".join(f"{k} {v:.1f}" for v, k in top))
        cupti = {}
        for case in cases:
            for call, ms in case.get("cupti", {}).items():
                cupti.setdefault(call, []).append(ms)
        top = sorted(((sum(v) / len(cases), k) for k, v in cupti.items()), reverse=True)[:5]
        lines.append("    CUPTI calls, ms/session: " + ", ".join(f"{k} {v:.1f}" for v, k in top))
    heard = {}
    for case in by.get("as committed", []):
        for label in ("graph callbacks heard", "launch entry callback", "subscriber known()"):
            heard.setdefault(label, []).append(case.get("timers", {}).get(label, [0, 0])[1])
    lines.append("  calls per session, as committed: " + ", ".join(f"{k} {_median(v)}" for k, v in heard.items())
                 + f"; environment: {data.get('notes', {}).get('environment')}")
    alone = [f"{k[len('alone: '):]} {_median(v):.2f}" for k, v in data.get("notes", {}).items()
             if k.startswith("alone: ") and _median(v) is not None]
    lines.append("  outside sessions, ms (median): " + ", ".join(alone))
    return lines


def summary_pm(name: str, data: dict) -> list[str]:
    title = {"pm_late": "NVTX domain made at the first range, inside the first PM session (ca0cfa0..69e3031)",
             "pm_early": "NVTX domain made before CUDA (gpuscope's import before ca0cfa0)"}[name]
    lines = [f"item 13 [{name}]: {title}"]
    if not data.get("cases"):
        return lines + [f"  no case: {'; '.join(data.get('errors', []))[:200]}"]
    plain = {c["rep"]: c["us"] for c in data["cases"] if c["case"] == "plain"}
    numba_plain = {c["rep"]: c["us"] for c in data["cases"] if c["case"] == "Numba loop, plain"}
    by = {}
    for case in data["cases"]:
        by.setdefault(case["case"], []).append(case)
    lines.append(f"  {'case':<34} {'us/step':>8} {'% over plain, per rep':<24} {'decode us/smp':>13} {'samples':>8}"
                 f" {'lost':>6}")
    for label, cases in by.items():
        base = numba_plain if label.startswith("Numba") else plain
        over = [f"{(c['us'] / base[c['rep']] - 1) * 100:+.1f}" for c in cases if base.get(c["rep"])]
        lines.append(f"  {label:<34} {_fmt(_median([c['us'] for c in cases]), 2, 8)} {' '.join(over):<24}"
                     f" {_fmt(_median([c.get('decode_us_per_sample') for c in cases]), 2, 13)}"
                     f" {_fmt(_median([c.get('samples') for c in cases]), 0, 8)}"
                     f" {_fmt(_median([c.get('lost') for c in cases]), 0, 6)}")
    nvtx = {k[len("nvtx_"):]: v for k, v in data.get("notes", {}).items() if k.startswith("nvtx_")}
    lines.append(f"  NVTX on gpuscope's domain: {nvtx}")
    return lines


def summary(results: dict) -> str:
    lines = []
    children = results["children"]
    if "topdown" in children:
        lines += summary_topdown(children["topdown"])
    for name in ("pm_late", "pm_early"):
        if name in children:
            lines += summary_pm(name, children[name])
    errors = [f"{name}: {e}" for name, data in children.items() for e in data.get("errors", [])]
    if errors:
        lines.append(f"errors ({len(errors)}; all in the JSON): " + " | ".join(errors)[:300])
    lines.append(f"whole probe {results.get('wall_s')} s; results in {Path(results['args']['out']).resolve()}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="cost_regressions", help="folder for the JSON and the cProfile listing")
    parser.add_argument("--only", choices=sorted(CHILDREN), default="all", help="topdown (item 14), pm (item 13)")
    parser.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    parser.add_argument("--case-seconds", type=float, default=None, help="length of each PM case (2.5; quick 1.0)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions of the PM cases (2; quick 1)")
    parser.add_argument("--sessions", type=int, default=None, help="warm sessions per Top-Down variant (8; quick 3)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds the whole probe may take")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.case_seconds = args.case_seconds or (1.0 if args.quick else 2.5)
    args.reps = args.reps or (1 if args.quick else 2)
    args.sessions = args.sessions or (3 if args.quick else 8)
    sys.path.insert(0, str(ROOT))
    if args.child:
        res = Results(Path(args.out), args.child, args.deadline or time.time() + 600)
        try:
            (child_topdown if args.child == "topdown" else child_pm)(args, res)
        except Exception as exc:
            res.error(args.child, exc)
        res.save()
        return
    results = run_children(args)
    cprofile = results["children"].get("topdown", {}).get("notes", {}).get("cprofile")
    if cprofile:
        (Path(args.out) / "topdown_cprofile.txt").write_text(cprofile)
        print("cProfile of three warm kernel-mode Top-Down sessions, top 25 by cumulative time:")
        print("\n".join(line for line in cprofile.splitlines() if line.strip())[:6000])
    print(summary(results))


if __name__ == "__main__":
    main()
