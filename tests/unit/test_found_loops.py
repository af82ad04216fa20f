"""Auto mode without annotations in a session: the loop it profiles, the launch IDs its rows carry, the launches it
replays while searching, and what it leaves unprofiled and says (a Profiler over a stand-in range profiler: no GPU).
"""

import os
import sys
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuscope._range_profiling import session as _session
from gpuscope._range_profiling.filters import KernelFilter
from gpuscope.cupti import range_profiler
from gpuscope.cupti._types import ProfilerRange, ReplayMode
from gpuscope.cupti.callbacks import Launch
from gpuscope.errors import GpuscopeWarning

sys.path.insert(0, str(Path(__file__).parent))
from test_repetition import pytorch_like_stream  # noqa: E402

CTX = 0x5150


class StandInProfiler:
    """CUPTI's range profiler as auto mode drives it. Kernel replay: each launch while started is a range. User
    replay: a pass runs from start to stop, its launches are its ranges, and the stop that ends the configuration's
    last pass says so (CUPTI counts passes per profiler, whatever gpuscope does with the launches)."""

    def __init__(self, passes: int, replay: int):
        self.passes, self.user = passes, replay == int(ReplayMode.USER)
        self.started = self.closed = False
        self.ranges = self.in_pass = self.pass_index = self.replayed = 0

    def start(self):
        assert not self.closed and not self.started
        self.started, self.in_pass = True, 0

    def stop(self):
        assert not self.closed and self.started
        self.started = False
        if not self.user:
            return SimpleNamespace(all_passes_submitted=True)
        self.ranges = max(self.ranges, self.in_pass)
        self.pass_index = (self.pass_index + 1) % self.passes
        return SimpleNamespace(all_passes_submitted=self.pass_index == 0)

    def launch(self):
        if not self.started:
            return
        if self.user:
            self.in_pass += 1
        else:
            self.ranges += 1
            self.replayed += 1

    def decode(self):
        return 0

    def initialize_counter_data(self, image):
        self.ranges = 0

    def close(self):
        self.closed = True


@pytest.fixture
def auto(monkeypatch):
    """make(passes) -> an open auto-mode Profiler as start() leaves it, over stand-in profilers (p.profilers lists
    those it was given; p.groups the passes of each group it read values from)."""
    monkeypatch.setattr(range_profiler, "num_ranges", lambda image: image.profiler.ranges)
    monkeypatch.setattr("gpuscope.cupti.profiler.deinitialize", lambda **k: None)
    monkeypatch.setattr("gpuscope._gpu.keep.enabled", lambda: False)
    collected = []  # the passes of every group whose values were read
    collect = _session.Profiler._collect_iterations

    def record(self):
        group = self._collector.group
        collected.append(group.passes_run)
        collect(self)

    monkeypatch.setattr(_session.Profiler, "_collect_iterations", record)

    def make(passes: int = 2):
        p = _session.Profiler.__new__(_session.Profiler)
        p.mode = p.mode_used = _session.Mode.AUTO
        p.metric_set, p.metrics, p.device, p.passes, p.cycles = "test", ["m"], 0, passes, passes
        p.max_depth, p.sample_every, p.filter = 1, 1, KernelFilter.build()
        p.max_ranges, p._fixed_ranges, p._size_from_first = 64, False, True
        p._seen, p._notes, p._rows, p._set_attrs = {}, {}, [], {}
        p._thread, p._pid, p._stack, p._open_rows, p._launch = threading.get_ident(), os.getpid(), [], [], 0
        p._pending, p._other_threads, p._iter_path, p._steps = threading.local(), set(), None, False
        p._new_group()
        p._group_index, p._iteration = 0, {}
        p._context = SimpleNamespace(handle=CTX, close=lambda: None)
        p._recorder = p._rp = p._collector = None
        p._host = SimpleNamespace(evaluate=lambda image, index, metrics: [float(index)])
        p.properties = {"m": {"units": "", "description": "", "metric_type": "counter"}}
        p.device_info, p.chip, p.print_report, p._state, p._dataset = None, "GH100", False, "open", None
        p.profilers, p.groups = [], collected
        p._warn_replay_cost = lambda *args, **kwargs: None  # reads the device's memory

        def configure(range_mode, replay_mode, ranges, depth=1):  # Profiler._configure without CUPTI
            key = (int(range_mode), int(replay_mode), int(ranges))
            if key == p._key:
                return
            if p._rp is not None:
                p._rp.close()
            p._rp = StandInProfiler(passes, int(replay_mode))
            p.profilers.append(p._rp)
            p._image = SimpleNamespace(profiler=p._rp)
            p._key, p.max_ranges = key, int(ranges)
            if p._collector is not None:
                p._collector.rp = p._rp

        p._configure = configure
        configure(ProfilerRange.AUTO, ReplayMode.KERNEL, 64)  # as start() does in auto mode
        return p

    return make


def one_pass_each(p, names) -> None:
    """Give the stand-in session a pass plan of one metric per pass, *names* in pass order (as the ``topdown`` set's
    plan gives each pass counters of its own)."""
    from gpuscope._gpu.pass_plan import PassPlan

    p.metrics = list(names)
    p._plan = PassPlan(requested=tuple(names), collected=tuple(names), groups=tuple((m,) for m in names), derived=())
    p.properties = {m: p.properties["m"] for m in names}


def feed(p, stream) -> None:
    """The launch callbacks' calls for each launch, the stand-in profiler hearing it in between."""
    for signature in stream:
        symbol, grid, block = signature if isinstance(signature, tuple) else (signature, (1, 1, 1), (32, 1, 1))
        token = p._on_enter(Launch(symbol, grid, block, CTX))
        p._rp.launch()
        if token is not None:
            p._on_exit(token)


def rows(p, replay: str) -> list:
    return [(r["kernel"], r["launch"]) for r in p._rows if r.get("replay") == replay]


def said(p) -> list[str]:
    """Close the session; the texts of every warning it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.close()
    return [str(w.message) for w in caught if issubclass(w.category, GpuscopeWarning)]


def close(p) -> list[str]:
    """Close the session; the texts of the warnings about what auto mode left unprofiled."""
    return [t for t in said(p) if t.startswith(("Auto mode profiled", "No repeated sequence"))]


def test_rows_carry_the_sessions_launch_ids_and_the_search_replays_each_kernel_once(auto):
    p = auto(passes=2)
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 13)
    p.close()
    # Launches 0-7 are searched: each (kernel, grid, block) is replayed once, its later launches run unprofiled.
    assert rows(p, "kernel") == [("fill_a", 0), ("fill_b", 1), ("gemm", 2), ("relu", 3)]
    assert p.profilers[0].replayed == 4
    # From launch 8, iterations of (gemm, relu): each group of two gives rows named by its first pass's launches.
    assert rows(p, "iteration") == [("gemm", 8), ("relu", 9), ("gemm", 12), ("relu", 13), ("gemm", 16), ("relu", 17),
                                    ("gemm", 20), ("relu", 21), ("gemm", 24), ("relu", 25)]
    a = p._notes
    assert (a["launches_before_repetition"], a["launches_replayed_before_repetition"]) == (8, 4)
    assert a["launches_unprofiled_by_reason"] == {"searching": 4}
    assert (a["launches_seen"], a["launches_profiled"], a["launches_unprofiled"]) == (28, 4 + 20, 4)
    assert a["kernels_never_profiled"] == []


@pytest.mark.parametrize(("stream", "period"), [
    ((["scale"] * 3 + ["matmul", "reduce"]) * 100, 5),
    ((["fwd", "bwd"] * 4 + ["adam"]) * 60, 9),
    (["fill"] * 3 + ["fill", "gemm", "relu", "gemm", "softmax"] * 60, 5),
    (["a", "b", "c"] * 5 + ["a", "b", "c", "log"] * 80, 4),
])
def test_the_loop_the_script_runs_is_profiled(auto, stream, period):
    p = auto(passes=2)
    feed(p, stream)
    assert close(p) == []  # every kernel profiled, the few launches left out not worth a warning
    a = p._notes
    assert a["repetition_period"] == period and a["repetition_relocks"] == 1
    assert {k for k, _ in rows(p, "iteration")} == set(stream)  # matmul, adam, softmax, log: all profiled
    assert a["kernels_never_profiled"] == []
    assert a["launches_seen"] == len(stream) == a["launches_profiled"] + a["launches_unprofiled"]
    assert a["launches_unprofiled"] <= 6 * period  # the search and the switch: a few periods, not a share
    assert all(n == 2 for n in p.groups if n is not None)  # no group mixes passes across the change of loop
    assert [r.closed for r in p.profilers] == [True] * len(p.profilers)


def test_a_group_cut_by_a_longer_loop_is_dropped_on_a_fresh_profiler(auto):
    # (a, b, c) x 5, then (a, b, c, log): the relock (launch 26, a log) comes with a group half run (launches 21-23,
    # pass 0). Its launches are counted, and the next group starts on a profiler made anew though the image's size is
    # the same: CUPTI counts a replay's passes itself, so the old one would end the next group after one pass.
    p = auto(passes=2)
    feed(p, ["a", "b", "c"] * 5 + ["a", "b", "c", "log"] * 12)
    close(p)
    assert p._notes["repetition_found_at"] == 26
    assert p._notes["launches_unprofiled_by_reason"]["loop_changed"] == 3
    assert [(r.user, r.closed) for r in p.profilers] == [(False, True), (True, True), (True, True)]
    assert p._key == (int(ProfilerRange.AUTO), int(ReplayMode.USER), 16)  # the size the period of 3 had
    assert all(n == 2 for n in p.groups)
    after = [r for r in rows(p, "iteration") if r[1] > 26]
    assert after[:4] == [("a", 27), ("b", 28), ("c", 29), ("log", 30)]
    # coverage "from the loop's first iteration" counts from the loop that took over, not the (a, b, c) inside it
    assert p._notes["loop_first_launch"] == p._notes["repetition_offset"] > 0


def test_what_the_loop_leaves_out_is_counted_per_kernel_and_said(auto):
    # A checkpoint after steps 4, 10, 17, 25, ...: no loop holds it, so it is never profiled, though (a, b, c) is
    # locked on from launch 8: the session says so, with the count per kernel.
    stream, due, gap = [], 4, 6
    for step in range(100):
        stream += ["a", "b", "c"]
        if step == due:
            stream.append(("checkpoint", (1, 1, 1), (32, 1, 1)))
            due, gap = due + gap, gap + 1
    p = auto(passes=2)
    feed(p, stream)
    (said,) = close(p)
    assert "Never profiled: checkpoint." in said and "checkpoint (10)" in said
    a = p._notes
    assert a["kernels_never_profiled"] == ["checkpoint"]
    assert a["launches_unprofiled_by_kernel"]["checkpoint"] == 10
    assert a["launches_unprofiled_by_reason"]["between_iterations"] == 10
    assert a["launches_seen"] == len(stream)


def test_launches_past_what_a_groups_iterations_share_are_counted(auto):
    # One iteration launches x inside (a, x, b, c): its group keeps only a; b and c of the other pass, and x, b, c of
    # this one, are counted, and x is named as never profiled.
    p = auto(passes=2)
    stream = ["a", "b", "c"] * 6 + ["a", "x", "b", "c"] + ["a", "b", "c"] * 5
    feed(p, stream)
    (said,) = close(p)
    a = p._notes
    assert a["launches_unprofiled_by_reason"]["unmatched"] == 5 and a["kernels_never_profiled"] == ["x"]
    assert "5 were in iterations that launched other kernels" in said and "Never profiled: x." in said
    assert a["launches_seen"] == len(stream) == a["launches_profiled"] + a["launches_unprofiled"]


def test_a_pytorch_like_script_is_profiled_step_by_step(auto):
    stream, step = pytorch_like_stream()
    init = len(stream) - 23 * 76
    p = auto(passes=2)
    feed(p, stream)
    p.close()
    a = p._notes
    assert a["repetition_period"] == 76
    it = rows(p, "iteration")
    # the step (76 launches of many kernels) is confirmed on its second copy, at the end of the second warm-up step:
    # the third and the 20 measured steps are followed, 10 groups of two and a last one completed from the group before
    assert a["repetition_found_at"] == init + 2 * 76 - 1
    assert len(it) == 76 * 11 and min(i for _, i in it) == init + 2 * 76
    first = [i for _, i in it[:76]]
    assert first == list(range(first[0], first[0] + 76))  # the process's launch IDs, not positions 0-75
    # The search replays each kernel, grid and block once, not every launch before the loop was found (91 of 178).
    before = a["launches_before_repetition"]
    assert p.profilers[0].replayed == len(set(stream[:before])) == 91 and before == 178
    assert a["launches_unprofiled_by_reason"].keys() <= {"searching", "between_iterations"}


def test_code_without_a_loop_replays_each_kernel_once_and_says_so(auto):
    stream = ["add" if i.bit_count() % 2 else "mul" for i in range(40)]  # Thue-Morse: no three copies of anything
    p = auto(passes=2)
    feed(p, stream)
    (said,) = close(p)
    assert said.startswith("No repeated sequence of launches was found in 40 launches")
    assert "mul (19), add (19)" in said or "add (19), mul (19)" in said
    assert rows(p, "kernel") == [("mul", 0), ("add", 1)] and p.mode_used is _session.Mode.KERNEL
    assert p._notes["launches_unprofiled_by_reason"] == {"searching": 38}


def test_launches_the_name_filters_leave_out_are_not_counted_as_auto_modes(auto):
    p = auto(passes=2)
    p.filter = KernelFilter.build(exclude="noise")
    stream, due, gap = [], 4, 6
    for step in range(60):
        stream += ["a", "b", "c"]
        if step == due:
            stream += ["noise", "checkpoint"]  # between iterations: one left out by the filter, one by auto mode
            due, gap = due + gap, gap + 1
    feed(p, stream)
    close(p)
    by_kernel = p._notes["launches_unprofiled_by_kernel"]
    assert set(by_kernel) == {"a", "b", "c", "checkpoint"} and by_kernel["checkpoint"] == 7  # no noise
    assert p._notes["kernels_never_profiled"] == ["checkpoint"]


def test_launches_from_the_loops_first_iteration_are_told_apart_from_setup(auto):
    # fill_a and fill_b are setup; the loop (gemm, relu) starts at launch 2 and is confirmed at launch 7: of its
    # launches 2-7 the search replayed gemm and relu once (launches 2 and 3), and 4-7 ran unprofiled.
    p = auto(passes=2)
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 13)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        p.close()
    a = p._notes
    assert (a["loop_first_launch"], a["launches_from_the_loop"]) == (2, 26)
    assert (a["launches_profiled_from_the_loop"], a["launches_searching_in_the_loop"]) == (2 + 20, 4)
    from gpuscope._range_profiling.coverage import from_the_loop_text

    assert from_the_loop_text(a) == ("From the loop's first iteration (launch 2) on: 22 of 26 launches profiled (85%); "
                                     "4 of the others were its iterations while it was searched for (warm-up steps, "
                                     "often).")


def test_a_pytorch_like_scripts_warm_up_is_counted_as_the_loops_iterations_during_the_search(auto):
    stream, _ = pytorch_like_stream()
    init = len(stream) - 23 * 76  # the initialisation, then 3 warm-up steps and 20 measured steps of 76 launches
    p = auto(passes=2)
    feed(p, stream)
    (said,) = close(p) or [""]
    a = p._notes
    from_loop = a["launches_from_the_loop"]
    assert a["loop_first_launch"] >= init and from_loop == len(stream) - a["loop_first_launch"]
    # the period-1 fills of the initialisation were followed first: the loop counted from is the step that took over
    assert a["loop_first_launch"] == a["repetition_offset"] and a["repetition_period"] == 76
    # all 20 measured steps are profiled (10 groups of two); what the loop lost is its iterations during the search
    assert a["launches_profiled_from_the_loop"] >= 20 * 76
    assert a["launches_profiled_from_the_loop"] + a["launches_searching_in_the_loop"] == from_loop
    assert a["launches_searching_in_the_loop"] > 0


def test_an_incomplete_last_group_is_completed_from_the_group_before(auto):
    # (gemm, relu) x 14 from launch 2: the loop is followed from launch 8, 11 iterations: groups 0-2 complete (9
    # iterations), the last one ran 2 of 3 passes. Its rows take the passes that ran from it (metric m) and the
    # third from the same launches of group 2 (metric n, NaN in the incomplete group's image, as CUPTI evaluates the
    # counters of passes that did not run).
    p = auto(passes=3)
    p.metrics = ["m", "n"]
    p.properties["n"] = p.properties["m"]

    def evaluate(image, index, metrics):
        partial = image.profiler.pass_index != 0  # a decode before the configuration's last pass
        return [index + (0.5 if partial else 0.0), float("nan") if partial else 1000.0 * len(p.groups) + index]

    p._host = SimpleNamespace(evaluate=evaluate)
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 14)
    assert not [t for t in said(p) if "incomplete group was dropped" in t]
    last = [r for r in p._rows if r.get("replay") == "iteration"][-2:]
    assert [(r["kernel"], r["launch"]) for r in last] == [("gemm", 26), ("relu", 27)]
    assert [list(r["values"]) for r in last] == [[0.5, 3000.0], [1.5, 3001.0]]
    assert [(r["iterations"], r["passes_from_earlier_group"], r["pass_group"]) for r in last] == [(2, 1, 3)] * 2
    earlier = [r for r in p._rows if r.get("replay") == "iteration"][:-2]
    assert {r["passes_from_earlier_group"] for r in earlier} == {0}
    a = p._notes
    assert (a["launches_completed_from_earlier_group"], a["passes_from_earlier_group"]) == (4, 1)
    assert "incomplete_group" not in a["launches_unprofiled_by_reason"]
    # the search's replays, 3 groups, the last group's 2 iterations: every launch from the loop's first on but the
    # 4 the search ran unprofiled
    assert a["launches_profiled_from_the_loop"] == 2 + 18 + 4 == a["launches_from_the_loop"] - 4


def test_an_incomplete_group_after_another_loop_is_not_completed(auto):
    # the last group's launches differ from the group before's (another loop took over): nothing to borrow from
    p = auto(passes=2)
    feed(p, ["a", "b"] * 9 + ["c", "d", "e"] * 7)
    said(p)
    assert "launches_completed_from_earlier_group" not in p._notes


def test_launches_past_a_last_iteration_cut_short_take_its_pass_from_the_group_before(auto):
    # As above with 3 passes, but the script's last launch (a gemm) begins an iteration it does not finish: the last
    # group ran one full iteration and one cut after gemm. gemm gets passes 0-1 from it; relu only pass 0, and the
    # pass plan says which counters pass 1 collected (n), so relu's n comes from the group before whatever the image
    # holds there (7777 here), as o (pass 2) does for both.
    p = auto(passes=3)
    one_pass_each(p, ["m", "n", "o"])

    def evaluate(image, index, metrics):
        if image.profiler.pass_index != 0:  # the incomplete group's image
            return [index + 0.5, 7777.0, float("nan")]
        return [float(index), 1000.0 * len(p.groups) + index, 2000.0 * len(p.groups) + index]

    p._host = SimpleNamespace(evaluate=evaluate)
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 13 + ["gemm"])
    assert not [t for t in said(p) if "incomplete group was dropped" in t]
    gemm, relu = [r for r in p._rows if r.get("replay") == "iteration"][-2:]
    assert (gemm["kernel"], relu["kernel"]) == ("gemm", "relu")
    assert list(gemm["values"]) == [0.5, 7777.0, 6000.0] and list(relu["values"]) == [1.5, 3001.0, 6001.0]
    assert (gemm["iterations"], gemm["passes_from_earlier_group"]) == (2, 1)
    assert (relu["iterations"], relu["passes_from_earlier_group"]) == (1, 2)
    a = p._notes
    assert (a["launches_completed_from_earlier_group"], a["passes_from_earlier_group"]) == (3, 2)
    assert "incomplete_group" not in a["launches_unprofiled_by_reason"]


def test_without_a_pass_plan_launches_past_the_cut_are_not_completed(auto):
    p = auto(passes=3)
    p.metrics = ["m", "n"]
    p.properties["n"] = p.properties["m"]

    def evaluate(image, index, metrics):
        partial = image.profiler.pass_index != 0
        return [index + (0.5 if partial else 0.0), float("nan") if partial else 1000.0 * len(p.groups) + index]

    p._host = SimpleNamespace(evaluate=evaluate)
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 13 + ["gemm"])
    assert [t for t in said(p) if "dropped from launch 1 of its iterations" in t]
    gemm = [r for r in p._rows if r.get("replay") == "iteration"][-1]
    assert (gemm["kernel"], gemm["launch"], list(gemm["values"])) == ("gemm", 26, [0.5, 3000.0])
    assert p._notes["launches_unprofiled_by_reason"]["incomplete_group"] == 1  # relu of the full iteration


def test_a_complete_group_whose_last_iteration_was_cut_keeps_its_launches(auto):
    # (gemm, relu) x 11 then gemm: the loop is followed from launch 8; group 2 is iterations 7, 8 and the gemm that
    # began a ninth and ended the script. The group is complete, but relu ran in 2 of its 3 passes: it keeps them,
    # with pass 2's counter (o) from relu of group 1, rather than being dropped as a launch the passes differ on.
    p = auto(passes=3)
    one_pass_each(p, ["m", "n", "o"])
    p._host = SimpleNamespace(evaluate=lambda image, index, metrics: [
        float(index), 1000.0 * len(p.groups) + index, 2000.0 * len(p.groups) + index])
    feed(p, ["fill_a", "fill_b"] + ["gemm", "relu"] * 11 + ["gemm"])
    assert not [t for t in said(p) if "did not launch the same kernels" in t]
    gemm, relu = [r for r in p._rows if r.get("replay") == "iteration"][-2:]
    assert list(gemm["values"]) == [0.0, 3000.0, 6000.0] and list(relu["values"]) == [1.0, 3001.0, 4001.0]
    assert [(r["iterations"], r["passes_from_earlier_group"]) for r in (gemm, relu)] == [(3, 0), (2, 1)]
    a = p._notes
    assert (a["launches_completed_from_earlier_group"], a["passes_from_earlier_group"]) == (2, 1)
    assert "unmatched" not in a["launches_unprofiled_by_reason"]


def test_rows_of_both_replays_carry_registers_and_shared_memory(auto, monkeypatch):
    """Kernel replay's rows before the loop is found and iteration replay's after: each row has its function's
    registers and static shared memory (asked of the driver once per function) and its launch's dynamic shared
    memory, which the Dataset holds as coords."""
    from gpuscope._results import build
    from gpuscope._gpu import functions

    asked = []
    held = {0x10: (24, 0), 0x20: (40, 2048), 0x30: (128, 0)}
    monkeypatch.setattr(functions, "function_resources", lambda handle: asked.append(handle) or held[handle])
    kernels = {"fill": (0x10, 0), "gemm": (0x20, 8192), "relu": (0x30, 0)}
    p = auto(passes=2)
    for symbol in ["fill"] + ["gemm", "relu"] * 13:
        function, dynamic = kernels[symbol]
        token = p._on_enter(Launch(symbol, (1, 1, 1), (32, 1, 1), CTX, function, dynamic))
        p._rp.launch()
        if token is not None:
            p._on_exit(token)
    close(p)
    assert {r.get("replay") for r in p._rows} == {"kernel", "iteration"}
    for row in p._rows:
        function, dynamic = kernels[row["kernel"]]
        assert (row["registers_per_thread"], row["shared_memory_static"], row["shared_memory_dynamic"]) == (
            *held[function], dynamic), row
    assert sorted(asked) == [0x10, 0x20, 0x30]  # once per function, whichever replay built the row
    ds = build.range_dataset(p._rows, p.metrics, p.properties, chip="GH100", attrs={"mode": "auto"})
    assert ds.registers_per_thread.values.tolist() == [held[kernels[k][0]][0] for k in ds.kernel.values.tolist()]
