"""Kernel filters, the names and IDs launches get, and the matching of launches across iterations (pure logic, no
GPU)."""

import threading
from types import SimpleNamespace

import pytest

import gpuscope as gs
from gpuscope._results import io as _io
from gpuscope._schema import names as _names
from gpuscope._results import build as _results
from gpuscope._range_profiling.filters import KernelFilter
from gpuscope._range_profiling.launches import IterationReplay, KernelReplay, Selected, matched_prefix
from gpuscope._range_profiling.modes import Mode, PerLaunchModes
from gpuscope.cupti.callbacks import Launch

NUMBA_STREAM = "_ZN8__main__6streamB2v1B94cw51cXTLSUwv1sCUt9Uw1VEw0NRRQPKzLTg4gaGAFA_2bUH0ZUMPEPg2QA2gBnQfEUwIPBMB0Tx6XBiEBQPaQQgE"
# Numba kernels named fma defined inside main() and inside helper() (c++filt: __main__::main::_3clocals_3e::fma...)
MAIN_FMA = "_ZN8__main__4main12_3clocals_3e3fmaB2v1B4cw51E5ArrayIfLi1E1C7mutable7alignedE"
HELPER_FMA = "_ZN8__main__6helper12_3clocals_3e3fmaB2v1B4cw51E5ArrayIfLi1E1C7mutable7alignedE"
MAIN_STREAM = "_ZN8__main__6streamB2v1B4cw51E5ArrayIfLi1E1C7mutable7alignedE"
CTX = 0x1234


def test_plain_names_match_readable_function_or_symbol():
    f = KernelFilter.build(kernels=["stream"])
    assert f.name_matches("__main__.stream", NUMBA_STREAM)
    assert f.name_matches("stream", "stream")
    assert not f.name_matches("__main__.fma", "x")
    assert not f.name_matches("__main__.streamer", "x")  # a plain name is exact, not a substring
    assert KernelFilter.build(kernels=NUMBA_STREAM).name_matches("whatever", NUMBA_STREAM)


def test_plain_names_match_the_qualified_name_and_its_dotted_endings():
    qualname = "__main__.main.<locals>.fma"
    for pattern in ("fma", "main.<locals>.fma", qualname):
        assert KernelFilter.build(kernels=pattern).name_matches("fma", MAIN_FMA, qualname), pattern
    for pattern in ("helper.<locals>.fma", "ma", "__main__.fma"):
        assert not KernelFilter.build(kernels=pattern).name_matches("fma", MAIN_FMA, qualname), pattern
    assert KernelFilter.build(kernels="regex:^__main__\\.main\\.").name_matches("fma", MAIN_FMA, qualname)
    assert not KernelFilter.build(exclude="main.<locals>.fma").name_matches("fma", MAIN_FMA, qualname)


def test_regex_and_exclude():
    f = KernelFilter.build(kernels="regex:stream|fma", exclude=["regex:^__main__\\.fma$"])
    assert f.name_matches("__main__.stream", "s")
    assert not f.name_matches("__main__.fma", "s")
    assert f.name_matches("mod.fma_v2", "s")
    assert not f.name_matches("cupy_gemm", "s")
    assert KernelFilter.build(exclude="cupy_copy").name_matches("mine", "s")
    assert not KernelFilter.build(exclude="cupy_copy").name_matches("cupy_copy", "cupy_copy")


def test_launch_window():
    f = KernelFilter.build(launch_skip=2, launch_count=3)
    assert [f.in_window(i) for i in range(7)] == [False, False, True, True, True, False, False]
    assert f.done(5) and not f.done(4)
    g = KernelFilter.build(launch_skip=1)
    assert not g.in_window(0) and g.in_window(10**6) and not g.done(10**6)
    assert not KernelFilter.build().active and g.active


@pytest.mark.parametrize("kwargs, error, match", [
    ({"launch_count": 0}, ValueError, "launch_count=0 would profile nothing"),
    ({"launch_skip": -1}, ValueError, "launch_skip must be at least 0"),
    ({"launch_count": 2.5}, TypeError, "launch_count must be an integer"),
    ({"launch_skip": True}, TypeError, "launch_skip must be an integer"),
    ({"kernels": ["regex:("]}, ValueError, "not a valid regular expression"),
    ({"kernels": [""]}, TypeError, "non-empty strings"),
    ({"exclude": 3}, TypeError, "kernel name, 'regex:<pattern>' or a list"),
])
def test_bad_filters_say_what_to_do(kwargs, error, match):
    with pytest.raises(error, match=match):
        KernelFilter.build(**kwargs)


def test_describe():
    assert KernelFilter.build().describe() == "every launch"
    text = KernelFilter.build(kernels=["a", "regex:b.*"], launch_count=4).describe()
    assert "kernels=['a', 'regex:b.*']" in text and "launch_count=4" in text


def _sel(symbol, grid=(1, 1, 1)):
    return Selected(symbol, symbol, "", grid, (32, 1, 1), 0)


def test_matched_prefix_same_iterations():
    seq = [_sel("a"), _sel("b"), _sel("a")]
    assert matched_prefix([seq, list(seq), list(seq)]) == 3
    assert matched_prefix([]) == 0


def test_matched_prefix_stops_at_the_first_difference_never_mislabels():
    a, b, c, x = _sel("a"), _sel("b"), _sel("c"), _sel("x")
    assert matched_prefix([[a, b, c], [a, x, b, c], [a, b, c]]) == 1  # an extra kernel shifts what follows
    assert matched_prefix([[a, b, c], [a, b]]) == 2  # a later iteration stops early
    assert matched_prefix([[a, b], [a, b, c]]) == 2  # or launches more
    assert matched_prefix([[_sel("k", (4, 1, 1))], [_sel("k", (8, 1, 1))]]) == 0  # same kernel, other grid


class FakeRangeProfiler:
    """Records the CUPTI calls a collector makes."""

    def __init__(self):
        self.calls = []

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")
        return "stopped"

    def push_range(self, name):
        self.calls.append(f"push {name}")

    def pop_range(self):
        self.calls.append("pop")


def _launch(symbol, grid=(1, 1, 1), context=CTX):
    return Launch(symbol, grid, (128, 1, 1), context)


def _run(collector, launches):
    for launch in launches:
        token = collector.on_enter(launch)
        if token is not None:
            collector.on_exit(token)


def test_kernel_replay_runs_left_out_launches_with_the_profiler_stopped():
    rp = FakeRangeProfiler()
    kr = KernelReplay(rp, CTX, KernelFilter.build(kernels="regex:stream"), lambda s: f"m.{s}", lambda: ("step", None),
                      lambda: 200)
    kr.running = True
    _run(kr, [_launch("stream"), _launch("fma"), _launch("stream", context=99), _launch("stream")])
    assert rp.calls == ["stop", "start"]  # around fma only; the other context's launch is not this session's
    assert [(s.kernel, s.qualname, s.parent, s.exit_ns) for s in kr.selected] == [
        ("stream", "m.stream", "step", 200)] * 2
    assert kr.left_out == 1 and kr.other_context == 1


def test_kernel_replay_launch_window_counts_matching_launches_only():
    kr = KernelReplay(FakeRangeProfiler(), CTX, KernelFilter.build(kernels="k", launch_skip=1, launch_count=2),
                      str, lambda: ("", None), lambda: 0)
    _run(kr, [_launch("k"), _launch("z"), _launch("k", (2, 1, 1)), _launch("k", (3, 1, 1)), _launch("k", (4, 1, 1))])
    assert [s.grid for s in kr.selected] == [(2, 1, 1), (3, 1, 1)]


def test_iteration_replay_records_every_launch_of_each_iteration():
    rp = FakeRangeProfiler()
    it = IterationReplay(rp, CTX, KernelFilter.build(exclude="noise"), str, lambda: ("step", "decorated"), lambda: 5)
    it.begin(0)
    _run(it, [_launch("a"), _launch("noise"), _launch("b"), _launch("a", context=99)])
    assert it.end() == "stopped"
    it.begin(0)
    _run(it, [_launch("a"), _launch("noise"), _launch("b")])
    it.end()
    assert rp.calls == ["start", "stop", "start", "stop"]  # auto ranges: nothing pushed, nothing stopped mid-pass
    group = it.take_group()
    assert group.passes_run == 2 and group.first_iteration == 0
    assert [[(s.symbol, s.wanted, s.exit_ns) for s in p] for p in group.passes] == [
        [("a", True, 5), ("noise", False, 5), ("b", True, 5)]] * 2
    assert matched_prefix(group.passes) == 3
    assert it.left_out == 2 and it.other_context == 1
    it.on_enter(_launch("a"))  # between iterations: nothing happens
    assert it.group is None and rp.calls[-1] == "stop"


def test_iteration_window_is_per_iteration():
    it = IterationReplay(FakeRangeProfiler(), CTX, KernelFilter.build(launch_skip=1, launch_count=1), str,
                         lambda: ("", None), lambda: 0)
    for _ in range(2):
        it.begin(0)
        _run(it, [_launch("a"), _launch("b"), _launch("c")])
        it.end()
    assert [[s.wanted for s in p] for p in it.take_group().passes] == [[False, True, False]] * 2


def test_a_counted_iteration_profiles_nothing_and_counts_this_context():
    rp = FakeRangeProfiler()
    it = IterationReplay(rp, CTX, KernelFilter.build(), str, lambda: ("", None), lambda: 0)
    it.begin_count()
    _run(it, [_launch("a"), _launch("b"), _launch("c", context=99)])
    assert it.end_count() == 2 and rp.calls == [] and it.group is None and it.iteration == 1
    it.begin(0)
    _run(it, [_launch("a")])
    it.end()
    assert it.take_group().first_iteration == 1


def test_kernels_defined_inside_functions_are_named_as_the_user_calls_them(tmp_path):
    """Rows say fma, not __main__.main.<locals>.fma; a second fma is told apart; the qualified name is kept."""
    kr = KernelReplay(FakeRangeProfiler(), CTX, KernelFilter.build(), _names.demangle, lambda: ("", None), lambda: 0)
    _run(kr, [_launch(MAIN_FMA), _launch(MAIN_STREAM), _launch(HELPER_FMA), _launch(MAIN_FMA)])
    assert [s.kernel for s in kr.selected] == ["fma", "stream", "helper.<locals>.fma", "fma"]
    rows = [PerLaunchModes._launch_row(SimpleNamespace(mode=Mode.KERNEL), s, i, [1000.0 * (i + 1)], 0, 0, 1, "kernel")
            for i, s in enumerate(kr.selected)]
    props = {"gpu__time_duration.sum": {"units": "nanosecond", "description": "", "metric_type": "counter"}}
    ds = _results.range_dataset(rows, ["gpu__time_duration.sum"], props, chip="GH100", attrs={"mode": "kernel"})
    assert ds.kernel_qualname.values.tolist() == ["__main__.main.<locals>.fma", "__main__.stream",
                                                  "__main__.helper.<locals>.fma", "__main__.main.<locals>.fma"]
    report = gs.report(ds)
    assert sorted(report.index) == ["fma", "helper.<locals>.fma", "stream"]
    assert report.loc["fma", "launches"] == 2
    assert sorted(gs.report(ds, by="kernel_qualname").index) == sorted(set(ds.kernel_qualname.values.tolist()))
    _io.save_dataset(ds, tmp_path / "names.nc")
    assert _io.open_dataset(tmp_path / "names.nc").kernel_qualname.values.tolist() == ds.kernel_qualname.values.tolist()


def test_a_decorated_name_is_preferred_and_left_out_launches_take_no_name():
    kr = KernelReplay(FakeRangeProfiler(), CTX, KernelFilter.build(exclude="main.<locals>.fma"), _names.demangle,
                      lambda: ("", None), lambda: 0)
    _run(kr, [_launch(MAIN_FMA), _launch(HELPER_FMA)])
    assert [s.kernel for s in kr.selected] == ["fma"]  # helper's fma: the only fma among the rows
    decorated = KernelReplay(FakeRangeProfiler(), CTX, KernelFilter.build(), _names.demangle,
                             lambda: ("", "my_fma"), lambda: 0)
    _run(decorated, [_launch(MAIN_FMA)])
    assert [(s.kernel, s.qualname) for s in decorated.selected] == [("my_fma", "__main__.main.<locals>.fma")]


class KernelRows(PerLaunchModes):
    """Kernel mode's collection (``PerLaunchModes._collect_kernels``) over a stand-in profiler, image and host."""

    mode, max_ranges, passes = Mode.KERNEL, 64, 1

    def __init__(self, kfilter, capacity=0):
        self._rp, self._image, self._rows, self._notes, self.metrics = FakeRangeProfiler(), object(), [], {}, ["m"]
        self.emptied_at = 0  # launches selected when the image was last emptied: it holds the ranges since
        self._rp.decode = lambda: 0
        self._rp.initialize_counter_data = lambda image: setattr(self, "emptied_at", len(self._collector.selected))
        self._host = SimpleNamespace(evaluate=lambda image, index, metrics: [float(index)])
        self._collector = KernelReplay(self._rp, CTX, kfilter, str, lambda: ("", None), lambda: 0,
                                       capacity=capacity, on_full=self._flush_kernels)
        self._collector.running = True


@pytest.mark.parametrize("capacity", [0, 2])  # 2: the counter-data image is emptied between the profiled launches
def test_launch_is_the_launchs_id_in_the_session_counting_left_out_launches(monkeypatch, capacity):
    """-k regex:collide --launch-skip 2 --launch-count 3: the rows are launches 4, 6 and 7, as Nsight Compute's ID."""
    from gpuscope.cupti import range_profiler

    session = KernelRows(KernelFilter.build(kernels="regex:collide", launch_skip=2, launch_count=3), capacity)
    monkeypatch.setattr(range_profiler, "num_ranges",
                        lambda image: len(session._collector.selected) - session.emptied_at)
    stream = ["a", "collide", "b", "collide", "collide", "c", "collide", "collide", "collide", "collide"]
    _run(session._collector, [_launch(s) for s in stream[:3]] + [_launch("x", context=99)]
         + [_launch(s) for s in stream[3:]])  # another context's launch is not this device's: not counted
    session._collect_kernels()
    assert [(r["kernel"], r["launch"]) for r in session._rows] == [("collide", 4), ("collide", 6), ("collide", 7)]
    assert session._collector.heard == len(stream) and session._collector.other_context == 1
    assert session._notes.get("image_flushes", 0) == (1 if capacity else 0)


def test_a_full_image_of_fixed_size_keeps_the_names_of_the_launches_it_holds(monkeypatch):
    """max_ranges fixed by the user: CUPTI keeps the first ranges and reports no drop; the rows it holds keep their
    kernel names and launch IDs, and the dropped launches are counted and said (seen on an H200: 8 ranges for 11
    launches, and every row lost its name)."""
    from gpuscope.cupti import range_profiler

    session = KernelRows(KernelFilter.build())
    session.max_ranges = 3
    monkeypatch.setattr(range_profiler, "num_ranges", lambda image: 3)
    _run(session._collector, [_launch(s) for s in ["a", "b", "c", "d", "e"]])
    with pytest.warns(gs.GpuscopeWarning, match="2 launch.*dropped"):
        session._collect_kernels()
    assert [(r["kernel"], r["launch"]) for r in session._rows] == [("a", 0), ("b", 1), ("c", 2)]
    assert session._notes["launches_dropped"] == 2


def test_iteration_rows_keep_their_position_counting_left_out_launches():
    it = IterationReplay(FakeRangeProfiler(), CTX, KernelFilter.build(kernels="b"), str, lambda: ("", None),
                         lambda: 0)
    it.begin(0)
    _run(it, [_launch("a"), _launch("b"), _launch("c"), _launch("b")])
    it.end()
    (pass0,) = it.take_group().passes
    assert [(i, s.symbol) for i, s in enumerate(pass0) if s.wanted] == [(1, "b"), (3, "b")]


class AutoNames(PerLaunchModes):
    """The per-launch part of a session, enough to make its collectors."""

    _rp, _context, filter, max_ranges, _fixed_ranges = FakeRangeProfiler(), SimpleNamespace(handle=CTX), None, 8, True
    _annotate = staticmethod(lambda: ("", None))


def test_a_sessions_collectors_share_one_table_of_names():
    """Auto mode: kernel replay before the loop is found, then iterations; helper's fma came first, so main's fma is
    never also called fma in the same Dataset."""
    session = AutoNames()
    session.filter = KernelFilter.build()
    kernel_phase = KernelReplay(FakeRangeProfiler(), CTX, session.filter, _names.demangle, lambda: ("", None),
                                lambda: 0, names=session._kernel_names())
    _run(kernel_phase, [_launch(HELPER_FMA)])
    iterations = session._iteration_replay()
    iterations.begin(0)
    _run(iterations, [_launch(MAIN_FMA), _launch(HELPER_FMA)])
    iterations.end()
    assert [s.kernel for s in kernel_phase.selected] == ["fma"]
    assert [s.kernel for s in iterations.take_group().passes[0]] == ["main.<locals>.fma", "fma"]


def test_kernel_rows_carry_registers_and_shared_memory_asked_once_per_function(monkeypatch):
    """Each row gets its function's registers and static shared memory (the driver asked once per function for the
    session, across emptied images; -1 where it refuses) and its launch's dynamic shared memory."""
    from gpuscope._gpu import functions
    from gpuscope.cupti import range_profiler

    asked = []
    held = {0xA0: (16, 0), 0xB0: (168, 1024)}

    def query(handle):
        asked.append(handle)
        return held.get(handle, (-1, -1))

    monkeypatch.setattr(functions, "function_resources", query)
    session = KernelRows(KernelFilter.build(), capacity=2)
    monkeypatch.setattr(range_profiler, "num_ranges",
                        lambda image: len(session._collector.selected) - session.emptied_at)
    launches = [("stream", 0xA0, 0), ("gemm", 0xB0, 213188), ("stream", 0xA0, 0), ("gone", 0xDEAD, 512),
                ("gemm", 0xB0, 4096), ("bare", 0, 0)]
    _run(session._collector, [Launch(s, (1, 1, 1), (128, 1, 1), CTX, f, dyn) for s, f, dyn in launches])
    session._collect_kernels()
    assert session._notes["image_flushes"] == 2  # three images: the cache outlives each
    rows = [(r["kernel"], r["registers_per_thread"], r["shared_memory_static"], r["shared_memory_dynamic"])
            for r in session._rows]
    assert rows == [("stream", 16, 0, 0), ("gemm", 168, 1024, 213188), ("stream", 16, 0, 0), ("gone", -1, -1, 512),
                    ("gemm", 168, 1024, 4096), ("bare", -1, -1, 0)]
    assert asked == [0xA0, 0xB0, 0xDEAD]  # once per function; no handle, no question
    ds = _results.range_dataset(session._rows, ["m"], {"m": {}}, chip="GH100", attrs={"mode": "kernel"})
    assert ds.registers_per_thread.values.tolist() == [16, 168, 16, -1, 168, -1]
    assert ds.shared_memory_dynamic.values.tolist() == [0, 213188, 0, 512, 4096, 0]


def test_an_empty_last_iteration_is_named_with_its_likely_cause():
    """``prof.step()`` at the end of each iteration (where torch.profiler wants it) begins an empty iteration after the
    last one; the warning of a group whose iterations differ says so and what to do."""
    from gpuscope._range_profiling.launches import _Group
    from gpuscope._range_profiling.pass_groups import _empty_last_iteration

    a = _launch("a")
    empty_last = _Group(0, 1, passes=[[a], [a], []])
    assert "Iteration 3 launched nothing" in _empty_last_iteration(empty_last)
    assert "top of each iteration" in _empty_last_iteration(empty_last)
    assert _empty_last_iteration(_Group(0, 1, passes=[[a], [], [a]])) == ""  # an empty iteration inside the group
    assert _empty_last_iteration(_Group(0, 1, passes=[[a], [a]])) == ""
