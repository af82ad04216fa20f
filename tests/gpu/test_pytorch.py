"""PyTorch in the same process: CUDA graphs are counted and their kernels named (or profiled as user ranges, or
PC-sampled kernel by kernel), and torch.profiler (Kineto, another CUPTI client) works after a gpuscope session; in the
other order gpuscope says who holds CUPTI."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuscope as gs

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def graph():
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.relu(a @ b).sum()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.relu(a @ b).sum()
    g.replay()
    torch.cuda.synchronize()
    return g


def _graph_kernels_named(prof, said, launches):
    """The session named the graph's kernels (a GEMM, a ReLU and a sum, the sum one kernel or more): each ran once per
    graph launch (a multiple of it, should one kernel be two nodes of the graph), with GPU time, and the warning
    lists them."""
    attrs = prof.dataset.attrs
    kernels = attrs["graph_kernels"]
    assert len(kernels) >= 2 and sum(kernels.values()) >= 3 * launches, (kernels, attrs.get("graph_kernels_unavailable"))
    assert all(n % launches == 0 for n in kernels.values()), kernels
    assert "graph_launches_unrecorded" not in attrs and "graph_kernels_unavailable" not in attrs
    assert set(attrs["graph_kernels_gpu_ns"]) == set(kernels) and min(attrs["graph_kernels_gpu_ns"].values()) > 0
    text = " ".join(str(w.message) for w in said)
    assert f"{next(iter(kernels))} x{kernels[next(iter(kernels))]}" in text, text


def _ten_graph_launches(graph, mode: str, match: str):
    """A session of *mode* over 10 replays of *graph*: it warns (*match*), counts them and names their kernels."""
    with pytest.warns(gs.GpuscopeWarning, match=match) as said:
        with gs.Profiler("launch", mode=mode) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
    assert prof.dataset.attrs["graph_launches"] == 10
    _graph_kernels_named(prof, said, 10)
    return prof


def test_graph_launches_in_kernel_mode_are_counted_and_said(graph):
    prof = _ten_graph_launches(graph, "kernel", "10 CUDA graph launch")
    assert "10 CUDA graph launches not profiled (kernels: " in prof.report().title


def test_graph_launches_in_auto_mode_are_counted_and_their_kernels_named(graph):
    _ten_graph_launches(graph, "auto", "10 CUDA graph launches ran .* auto-mode session")


def test_kernel_replay_beside_graph_launches_profiles_the_launches_and_names_the_graph_kernels(graph):
    """Kernel replay profiles the ordinary launches between graph launches (each gets its row: it stops before each
    graph launch), and the graph's kernels are named from activity records opened at the first."""
    x = torch.randn(1024, 1024, device="cuda")
    with pytest.warns(gs.GpuscopeWarning, match="3 CUDA graph launches") as said:
        with gs.Profiler("launch", mode="kernel") as prof:
            for _ in range(3):
                graph.replay()
                x.mul_(1.0001)
            torch.cuda.synchronize()
    ds = prof.dataset
    assert ds.sizes["range"] == 3 and (ds["gpu__time_duration.sum"].values > 0).all()
    _graph_kernels_named(prof, said, 3)
    assert not set(ds["kernel"].values.tolist()) & set(ds.attrs["graph_kernels"])


def test_pc_sampling_samples_the_kernels_of_graph_launches(graph):
    """PC sampling sees a graph's kernels one by one: the GEMM, the ReLU (an elementwise kernel) and the sum (a
    reduction), named as every Dataset of the process names them."""
    with gs.pc_sample(period=2**7) as pcs:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    ds = pcs.dataset
    assert ds.attrs["graph_launches"] == 10
    samples = ds["kernel_samples"].sum("stall_reason")
    sampled = [str(k) for k, n in zip(ds["kernel"].values.tolist(), samples.values.tolist()) if n > 0]
    found = [part for part in ("gemm", "elementwise", "reduce") if any(part in k.lower() for k in sampled)]
    assert len(found) >= 2, sampled


def test_fast_topdown_of_graph_launches_says_why_and_names_the_sampled_kernels(graph):
    """Fast Top-Down cannot take a graph's kernels (its PC half needs CUPTI detached, the graph copies need it
    attached): it stops after its PC block with an error that says so and names what PC sampling saw."""
    with pytest.raises(gs.FastTopDownError, match=r"launched 10 CUDA graph launches .*PC-sampling half needs CUPTI "
                                                  r"detached.*PC sampling saw \w") as caught:
        gs.profile_fast_topdown(lambda: [graph.replay() for _ in range(10)])
    assert "gpuscope.pc_sample()" in str(caught.value)


def test_graph_launches_in_iteration_mode_are_a_clear_error(graph):
    with pytest.raises(gs.GpuscopeError, match="CUDA graph"):
        with gs.Profiler("launch", mode="iteration") as prof:
            for _ in range(4):
                graph.replay()
                torch.cuda.synchronize()
                prof.step()


def test_a_user_range_around_a_graph_launch_is_a_row(graph):
    with gs.Profiler("launch", mode="user") as prof:
        for _ in range(3):
            with gs.range("graph"):
                graph.replay()
    ds = prof.dataset
    assert ds.sizes["range"] == 1 and str(ds["name"].values[0]) == "graph"
    assert float(ds["sm__cycles_elapsed.max"].values[0]) > 0


def _run(*parts: str) -> subprocess.CompletedProcess:
    code = "\n".join(textwrap.dedent(p) for p in parts)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


PROFILE = """
    def gpu_events():
        from torch.profiler import profile, ProfilerActivity
        x = torch.randn(512, 512, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                x @ x
            torch.cuda.synchronize()
        return sum(1 for e in p.events() if str(e.device_type).endswith("CUDA"))
"""


def test_torch_profiler_records_gpu_events_after_a_session():
    proc = _run("""
        import torch, gpuscope as gs
        """, PROFILE, """
        x = torch.randn(512, 512, device="cuda")
        with gs.Profiler("launch", mode="kernel") as prof:
            x @ x
            torch.cuda.synchronize()
        assert prof.dataset.sizes["range"] >= 1
        print("events", gpu_events())
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split("events")[1]) >= 5, proc.stdout


def test_after_torch_profiler_gpuscope_names_it_and_user_mode_works():
    proc = _run("""
        import torch, gpuscope as gs
        """, PROFILE, """
        assert gpu_events() >= 5
        x = torch.randn(512, 512, device="cuda")
        try:
            with gs.Profiler("launch", mode="kernel"):
                x @ x
        except gs.ProfilerBusyError as exc:
            print("refused:", exc)
        with gs.Profiler("launch", mode="user") as prof:
            with gs.range("mm"):
                x @ x
        print("user rows", prof.dataset.sizes["range"])
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "torch.profiler" in proc.stdout and "user rows 1" in proc.stdout, proc.stdout


def test_pc_sampling_after_torch_profiler_leaves_kinetos_cupti_alone():
    """PC sampling detaches CUPTI (cuptiFinalize) before it starts; with torch.profiler's Kineto holding CUPTI's
    subscriber that would wipe Kineto's state (issue 36 item 5): gpuscope does not detach, says who holds CUPTI, and
    torch.profiler records GPU events afterwards."""
    proc = _run("""
        import torch, gpuscope as gs
        from gpuscope._gpu import keep
        """, PROFILE, """
        assert gpu_events() >= 5
        x = torch.randn(512, 512, device="cuda")
        with gs.Profiler("launch", mode="user"):  # gpuscope attaches CUPTI (user mode needs no subscriber)
            with gs.range("mm"):
                x @ x
        print("detach:", keep.detach_cupti())
        try:
            with gs.pc_sample():
                x @ x
                torch.cuda.synchronize()
        except gs.ProfilerBusyError as exc:
            print("refused:", exc)
        print("events after", gpu_events())
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "detach: another CUPTI client of this process holds CUPTI's subscriber" in proc.stdout, proc.stdout
    assert int(proc.stdout.split("events after")[1]) >= 5, proc.stdout


TEARDOWN = """
    import os
    os.environ["TEARDOWN_CUPTI"] = "1"  # Kineto calls cuptiFinalize at the end of each profile
    import json, warnings
    import torch, gpuscope as gs
    from gpuscope._gpu import keep
    from gpuscope.cupti import callbacks
"""

COUNT = """
    import time
    y = torch.randn(1024, 1024, device="cuda")
    y @ y  # cuBLAS set up before the first count
    torch.cuda.synchronize()
    def profiled():  # Kineto's teardown waits, on a thread of its own, for the exit of the next CUDA runtime call
        events = gpu_events()
        for _ in range(20):
            time.sleep(0.05)
            torch.cuda.synchronize()
        return events
    def counted():
        with gs.Profiler(["smsp__inst_executed.sum", "sm__ctas_launched.sum"], mode="user") as prof:
            with gs.range("mm"):
                y @ y
                torch.cuda.synchronize()
        return {m: float(prof.dataset[m].values.sum()) for m in ("smsp__inst_executed.sum", "sm__ctas_launched.sum")}
"""


@pytest.mark.parametrize("first", ["gpuscope", "torch.profiler"])
def test_torch_profilers_cupti_teardown_between_sessions(first):
    """Kineto's teardown calls cuptiFinalize (issue 36 item 5). gpuscope first: it keeps a profiler but not CUPTI's
    subscriber (held longer, it kept torch.profiler from recording), and the next sessions count the same whether
    CUPTI still knew the kept profiler or refused it (then it is set up afresh). torch.profiler first: where Kineto
    holds the subscriber (unless it initialises lazily) it may finalize at any time, so gpuscope keeps nothing.
    Either way every session counts the same and torch.profiler records events (passed on the H100).
    (Kineto finalizes at the next CUDA runtime call after its profile, on any thread: the test lets that happen
    before the next session, which gpuscope cannot guarantee where torch.profiler holds the subscriber.)"""
    proc = _run(TEARDOWN, PROFILE, COUNT, f"""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            events = [profiled()] if {first!r} == "torch.profiler" else []
            holder = callbacks.other_client()  # Kineto, unless it initialises lazily
            counts = [counted()]
            kept = keep.kept_devices()
            events.append(profiled())
            counts.append(counted())
            events.append(profiled())
            counts.append(counted())
        said = [str(w.message)[:80] for w in caught if "finalized CUPTI" in str(w.message)]
        print("RESULT", json.dumps({{"events": events, "counts": counts, "kept": kept, "said": said,
                                     "holder": holder}}))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert all(e >= 5 for e in got["events"]), got
    assert got["counts"][0] == got["counts"][1] == got["counts"][2], got
    assert got["kept"] == ([0] if got["holder"] is None else []), got
    assert first == "torch.profiler" or got["holder"] is None, got
    assert len(got["said"]) <= 1, got  # said at most once where CUPTI refused the kept profiler


def test_gpuscope_run_follows_an_unmodified_training_loop(tmp_path):
    """`gpuscope run` on a PyTorch training step (transformer encoder layer, bf16 autocast, fused AdamW), 3 warm-up
    steps then 20: auto mode finds the step as the loop during the warm-up and profiles at least 95% of the launches
    from there on; the last pass group, which has fewer steps than the set has passes, takes its other passes
    from the group before (benchmarks/bench_auto_pytorch.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_auto_pytorch import SCRIPT

    script = tmp_path / "train_step.py"
    script.write_text(SCRIPT)
    warmup, steps = 3, 22  # 23 iterations or so profiled: not a multiple of the 7 passes
    done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "--set", "topdown", "--no-report", "-o",
                           str(tmp_path / "auto.nc"), str(script), str(warmup), str(steps)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ds = gs.open_dataset(tmp_path / "auto.nc")
    period, passes = int(ds.attrs["repetition_period"]), int(ds.attrs["passes"])
    assert 40 <= period <= 120  # the launches of one step (69 on the H100), not a repetition inside it
    seen, profiled = int(ds.attrs["launches_seen"]), int(ds.attrs["launches_profiled"])
    warm = seen - steps * period
    assert warm > 0
    said = {k: ds.attrs[k] for k in ds.attrs if k.startswith(("launches", "repetition"))}
    # the step, many kernels, is confirmed on its second copy: by the end of the warm-up (launch 241 of 1,624 on the
    # H100; the first warm-up step differs from the others: the optimizer makes its state); from there on at most 5%
    # of the launches run unprofiled (between iterations, where the loop changed), the last pass group completed
    # from the group before
    why = {k: int(v) for k, v in ds.attrs["launches_unprofiled_by_reason"].items()}
    assert int(ds.attrs["repetition_found_at"]) < warm, said
    assert sum(n for k, n in why.items() if k != "searching") <= 0.05 * steps * period, said
    assert int(ds.attrs["launches_completed_from_earlier_group"]) > 0, said  # 23 iterations of 7 passes: 2 left
    assert profiled <= seen and passes == 7
    assert ds["launch"].values.min() >= 0 and ds["launch"].values.max() < seen  # the process's launch IDs
