"""PC sampling without a GPU: argument checks, the stall-reason table, records -> Dataset, fast Top-Down."""

import ctypes

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._pc_sampling import fast as _fast
from gpuscope._pc_sampling import messages as _messages
from gpuscope._pc_sampling import records as _pcrecords
from gpuscope._pc_sampling import sampler as P
from gpuscope._pc_sampling import source as _source
from gpuscope.cupti import _types as T
from gpuscope.cupti.pc_sampling import PCRecords, SamplingBuffer
from gpuscope.metrics import pc_plot, topdown

PREFIX = _pcrecords.CUPTI_PREFIX
NAMES = [PREFIX + "long_scoreboard", PREFIX + "long_scoreboard_not_issued", PREFIX + "selected",
         PREFIX + "no_instructions", PREFIX + "wait", "smsp__pcsamp_sample_count"]
INDICES = np.array([14, 15, 39, 25, 36, 0], dtype=np.uint32)
KERNEL = "_ZN6cudapy8__main__6kernelB2v1E5ArrayIfLi1E1C7mutable7alignedE"


@pytest.mark.parametrize("period,log2", [(None, None), (32, 5), (1024, 10), (2**31, 31)])
def test_period_is_a_power_of_two_in_range(period, log2):
    assert P._period_log2(period) == log2


@pytest.mark.parametrize("period,match", [(1000, "nearest is period=1024"), (16, "out of range"),
                                          (2**32, "out of range"), ("x", "number of cycles"), (0, "power of two")])
def test_bad_period_says_what_to_do(period, match):
    with pytest.raises(ValueError, match=match):
        P.pc_sample(period=period)


def test_other_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        P.pc_sample(mode="fast")
    with pytest.raises(ValueError, match="drain_interval"):
        P.pc_sample(drain_interval=0)
    with pytest.raises(ValueError, match="buffer_pcs"):
        P.pc_sample(buffer_pcs=0)


def test_stall_reason_categories_match_topdown():
    for reason, (category, description) in _pcrecords.STALL_REASONS.items():
        name = "no_instruction" if reason == "no_instructions" else reason
        assert description
        if reason in ("selected", "not_selected"):
            assert category == "issued"
        elif reason == "warpgroup_arrive":  # Hopper PC-sampling state without a counter twin
            assert category == "backend_core"
        else:
            assert topdown.STALL_PARENT[name] == category


def test_reason_table_pairs_not_issued():
    base, column = _pcrecords._reason_table(NAMES)
    assert base == ["long_scoreboard", "selected", "no_instructions", "wait"]  # sample_count is not a state
    assert column[PREFIX + "long_scoreboard_not_issued"] == (0, True)
    assert column[PREFIX + "long_scoreboard"] == (0, False)


def test_pc_struct_layouts_are_the_packed_sizes():
    assert ctypes.sizeof(T.CUpti_PCSamplingPCData) == 64
    assert ctypes.sizeof(T.CUpti_PCSamplingData) == 80
    assert ctypes.sizeof(T.CUpti_PCSamplingStallReason) == 8


def test_sampling_buffer_take_copies_rows_and_empties():
    buf = SamplingBuffer(num_pcs=3, num_stall_reasons=2)
    pcs = buf.data.pPcData
    buf.data.totalNumPcs = 2
    buf.data.totalSamples = 9
    buf.data.droppedSamples = 1
    for i, (crc, off, counts) in enumerate([(7, 16, (4, 0)), (7, 32, (2, 3))]):
        pcs[i].cubinCrc, pcs[i].pcOffset, pcs[i].stallReasonCount = crc, off, 2
        for j, n in enumerate(counts):
            pcs[i].stallReason[j].pcSamplingStallReasonIndex = 10 + j
            pcs[i].stallReason[j].samples = n
    rec = buf.take()
    assert rec.pc_offset.tolist() == [16, 32, 32]  # zero-sample reasons are not rows
    assert rec.stall_reason_index.tolist() == [10, 10, 11]
    assert rec.samples.tolist() == [4, 2, 3]
    assert (rec.total_samples, rec.dropped_samples) == (9, 1)
    assert buf.data.totalNumPcs == 0 and buf.take().samples.size == 0


def _records():
    return PCRecords(
        cubin_crc=np.array([5, 5, 5, 5, 5, 6], dtype=np.uint64),
        pc_offset=np.array([16, 16, 16, 32, 32, 0], dtype=np.uint64),
        function_index=np.zeros(6, np.uint32),
        correlation_id=np.zeros(6, np.uint32),
        stall_reason_index=np.array([14, 15, 39, 36, 14, 25], dtype=np.uint32),
        samples=np.array([10, 4, 3, 6, 1, 2], dtype=np.uint32),
        function=np.array([KERNEL] * 5 + ["saxpy"]),
        total_samples=22,
        dropped_samples=0,
    )


def _dataset():
    reg = _source.CubinRegistry(crc=lambda b: 5)
    reg.add(b"\x7fELF")
    smap = _source.SourceMap(reg, lookup=lambda c, f, o: (o // 16, "k.py", "/src"),
                             sources={"k.py": "a = 1\nx = y[i]\nz = x * 2\n"})
    return _pcrecords.records_dataset(_records(), INDICES, NAMES, smap, chip="GH100",
                             attrs={"compute_capability": "9.0"})


def test_records_dataset_values():
    ds = _dataset()
    assert ds.sizes == {"pc": 3, "stall_reason": 4, "kernel": 2}
    assert ds.kernel.values.tolist() == ["kernel", "saxpy"]  # as every Dataset of the process names them
    assert ds.kernel_qualname.values.tolist() == ["__main__.kernel", "saxpy"]
    first = ds.isel(pc=0)
    assert (first.line.item(), first.line_text.item(), first.file.item()) == (1, "a = 1", "/src/k.py")
    assert ds.samples.sel(stall_reason="long_scoreboard").values.tolist() == [10, 1, 0]
    assert ds.samples_not_issued.sel(stall_reason="long_scoreboard").values.tolist() == [4, 0, 0]
    assert ds.kernel_samples.sel(kernel="kernel").values.tolist() == [11, 3, 0, 6]
    assert ds.category.sel(stall_reason="wait").item() == "backend_core"
    assert ds.attrs["functions_without_cubin"] == "saxpy"
    assert ds.isel(pc=2).line.item() == 0  # no cubin: function and offset only
    assert ds.attrs["total_samples"] == 22


def test_netcdf_round_trip(tmp_path):
    ds = _dataset()
    ds.to_netcdf(tmp_path / "pc.nc", engine="h5netcdf")
    back = xr.load_dataset(tmp_path / "pc.nc", engine="h5netcdf")
    xr.testing.assert_identical(back, ds)


def test_stall_percentages_and_fast_topdown():
    ds = _dataset()
    pct = _fast.stall_percentages(ds)
    k = "kernel"
    assert pct[topdown.stall_metric("long_scoreboard")].sel(kernel=k).item() == pytest.approx(100 * 11 / 20)
    assert pct[topdown.stall_metric("no_instruction")].sel(kernel="saxpy").item() == pytest.approx(100.0)
    ipc = xr.Dataset(
        {topdown.IPC_EXECUTED: ("kernel", [0.25]), topdown.IPC_ISSUED: ("kernel", [0.25]),
         topdown.THREADS_PER_INST: ("kernel", [32.0])},
        coords={"kernel": [k]},
    )
    td = _fast.fast_topdown(ds, ipc)
    stall = 100.0 - 25.0  # 100% - the issue rate, 4 * 0.25 of IPC_MAX 4
    # shares over stall reasons only: long_scoreboard 11, wait 6 (selected is not a stall)
    assert td["backend_memory"].sel(kernel=k).item() == pytest.approx(stall * 11 / 17)
    assert td["backend_core"].sel(kernel=k).item() == pytest.approx(stall * 6 / 17)
    assert td["retire"].sel(kernel=k).item() == pytest.approx(25.0)
    with pytest.raises(ValueError, match="no PC samples"):
        _fast.fast_topdown(ds, ipc.assign_coords(kernel=["missing"]))


def test_plot_tables():
    ds = _dataset()
    lines = pc_plot.line_stalls(ds, "kernel")
    assert lines.line.values.tolist() == [1, 2]
    assert lines.sel(stall_reason="long_scoreboard").values.tolist() == [10, 1]
    cats = pc_plot.kernel_stalls(ds)
    assert cats.sel(kernel="kernel", stall_category="backend_memory").item() == pytest.approx(100 * 11 / 20)
    assert float(cats.sel(kernel="saxpy").sum()) == pytest.approx(100.0) and cats.attrs["units"] == "percent"
    with pytest.raises(ValueError, match="pass kernel="):
        pc_plot.line_stalls(ds)


def test_plots_draw(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    ds = _dataset()
    ax = pc_plot.plot_line_stalls(ds, "kernel").axes[0]
    assert [t.get_text().split()[0] for t in ax.get_yticklabels()] == ["1", "2"]
    ax2 = pc_plot.plot_kernel_stalls(ds).axes[0]
    assert len(ax2.patches) == 2 * ds.category.to_series().nunique() or len(ax2.patches) > 0
    ax2.figure.savefig(tmp_path / "k.png")


def test_sample_total_counts_each_sample_once_and_not_cuptis_undercount():
    # CUPTI's totalSamples said 3 (at long periods on the H100 it says a few hundred where the records hold 10^5);
    # the records hold 22 warp-state samples (the 4 in long_scoreboard_not_issued repeat samples already counted)
    rec = _records()
    rec.total_samples, rec.dropped_samples, rec.non_user_kernel_samples = 3, 1, 5
    assert _pcrecords.sample_total(rec, INDICES, NAMES) == 22 + 1 + 5
    reg = _source.CubinRegistry(crc=lambda b: 5)
    smap = _source.SourceMap(reg, lookup=lambda c, f, o: (0, "", ""))
    ds = _pcrecords.records_dataset(rec, INDICES, NAMES, smap, chip="GH100", attrs={"compute_capability": "9.0"})
    assert (ds.attrs["total_samples"], ds.attrs["cupti_total_samples"]) == (28, 3)
    assert int(ds.samples.sum()) + ds.attrs["dropped_samples"] + ds.attrs["non_user_kernel_samples"] == 28


class _Context:
    handle = 1

    def make_current(self):
        pass

    def close(self):
        pass


class _Buffer:
    remaining_pcs = 0
    num_pcs, num_stall_reasons = 1, 1

    def __init__(self, records):
        self.records = records

    def take(self):
        return self.records

    def release(self):
        pass


def test_samples_cupti_could_not_attribute_are_counted_and_explained(monkeypatch):
    from gpuscope.cupti import pc_sampling as C

    rec = _records()
    rec.non_user_kernel_samples = 40
    sampler = P.PCSampler(period=1024, drain_interval=None)
    sampler._state, sampler._context, sampler._buffer = "sampling", _Context(), _Buffer(rec)
    sampler.reason_indices, sampler.reason_names = INDICES, NAMES
    monkeypatch.setattr(P, "_synchronize", lambda ctx: None)
    monkeypatch.setattr(P, "_get_data", lambda ctx, buf: PCRecords.empty())
    monkeypatch.setattr(C, "disable", lambda ctx: None)
    monkeypatch.setattr(P.PCSampler, "build", lambda self: "built")
    monkeypatch.setattr(P.PCSampler, "_settle", lambda self: None)
    with pytest.warns(gs.GpuscopeWarning, match=r"could not attribute 40 of 62 PC samples.*outside a pc_sample block"):
        sampler.close()
    assert sampler.dataset == "built" and sampler.records.non_user_kernel_samples == 40


def test_hardware_buffer_follows_the_period():
    """CUPTI sets up its device buffer at a block's first launch (0.29 s at 512 MiB, 0.11 s at 128 MiB on the
    H100), but below period 2**15 the buffer holds the samples CUPTI has not decoded yet: CUPTI's 512 MiB there."""
    from gpuscope._pc_sampling import sampler as P

    assert P.default_hardware_buffer(10) is None and P.default_hardware_buffer(14) is None
    assert P.default_hardware_buffer(15) == P.default_hardware_buffer(20) == 128 << 20
    assert P.default_hardware_buffer(None) is None
    assert P.PCSampler(period=2**15).hardware_buffer_size == 128 << 20
    assert P.PCSampler(period=2**15, hardware_buffer_size=256 << 20).hardware_buffer_size == 256 << 20
    with pytest.raises(ValueError, match="hardware_buffer_size"):
        P.PCSampler(period=2**13, hardware_buffer_size=4096)


def test_a_hardware_buffer_that_overflows_keeps_the_samples_and_says_so(monkeypatch):
    """On the H100 at period 2**10, cuptiPCSamplingGetData answers OUT_OF_MEMORY once a hardware buffer of 128 MiB
    or less is full (probes/probe_fast_cost.py): the block stops asking, disables (which brings what
    CUPTI still holds), keeps every record it had, marks the buffer full and warns; it does not raise."""
    from gpuscope.cupti import pc_sampling as C
    from gpuscope.errors import CuptiMemoryError

    rec = _records()
    sampler = P.PCSampler(period=1024, drain_interval=None, hardware_buffer_size=128 << 20)
    sampler._state, sampler._context, sampler._buffer = "sampling", _Context(), _Buffer(PCRecords.empty())
    sampler.reason_indices, sampler.reason_names = INDICES, NAMES
    calls = []

    def get_data(ctx, buf):
        calls.append(1)
        if len(calls) == 1:
            return rec  # drained before the buffer filled
        raise CuptiMemoryError(8, "cuptiPCSamplingGetData", "CUPTI_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(P, "_synchronize", lambda ctx: None)
    monkeypatch.setattr(P, "_get_data", get_data)
    monkeypatch.setattr(C, "disable", lambda ctx: calls.append("disable"))
    monkeypatch.setattr(P.PCSampler, "build", lambda self: "built")
    assert sampler._drain_once() == 0 and sampler._drain_once() == 0 and sampler._drain_once() == 0
    assert calls == [1, 1]  # not asked again once full
    with pytest.warns(gs.GpuscopeWarning, match=r"hardware buffer filled.*does not count"):
        sampler.close()
    assert calls == [1, 1, "disable"] and sampler.dataset == "built"
    assert sampler.records.hardware_buffer_full and sampler.records.total_samples == rec.total_samples


def test_a_full_hardware_buffer_is_said_to_lose_uncounted_samples():
    text = _messages.overflow_message(0, 2_479_002, True, 10)
    assert "lost samples" in text and "does not count" in text and "period=32768" in text
    assert "dropped 5 of 100" in _messages.overflow_message(5, 100, False, 12)


def test_a_kernel_that_ran_without_samples_is_named_even_when_cupti_counts_nothing(monkeypatch):
    """On the H100, CUPTI sometimes neither delivers nor counts the samples of a kernel it did not map: the
    block's launch count names that kernel, so the loss is said."""
    from gpuscope.cupti import pc_sampling as C

    rec = _records()
    rec.non_user_kernel_samples = 0
    sampler = P.PCSampler(period=1024, drain_interval=None)
    sampler._state, sampler._context, sampler._buffer = "sampling", _Context(), _Buffer(rec)
    sampler.reason_indices, sampler.reason_names = INDICES, NAMES
    sampled = str(rec.function[0])
    sampler.launches = {sampled: 10, "_Z6streamPfS_": 10}
    monkeypatch.setattr(P, "_synchronize", lambda ctx: None)
    monkeypatch.setattr(P, "_get_data", lambda ctx, buf: PCRecords.empty())
    monkeypatch.setattr(C, "disable", lambda ctx: None)
    monkeypatch.setattr(P.PCSampler, "build", lambda self: "built")
    monkeypatch.setattr(P.PCSampler, "_settle", lambda self: None)
    with pytest.warns(gs.GpuscopeWarning, match=r"No PC samples for stream \(10 launches\).*"
                                                r"lost uncounted.*outside a pc_sample block"):
        sampler.close()
    assert sampler.kernels_without_samples() == {"_Z6streamPfS_": 10}


def test_launch_recorders_share_the_callbacks(monkeypatch):
    """A Profiler session and a pc_sample block can both hear launches: CUPTI's launch callbacks are on while
    any recorder listens."""
    from gpuscope.cupti import callbacks, subscriber

    calls = []
    monkeypatch.setattr(subscriber, "_enable", lambda flag: calls.append(flag))
    monkeypatch.setattr(subscriber, "_subscription", [1, None])
    monkeypatch.setattr(subscriber, "_listening", ())
    monkeypatch.setattr(subscriber, "_open", set())
    unsubscribed = []
    monkeypatch.setattr(subscriber._f, "cuptiUnsubscribe", lambda handle: unsubscribed.append(handle))
    heard = []
    a = callbacks.LaunchRecorder(lambda launch: heard.append("a"))
    b = callbacks.LaunchRecorder(lambda launch: heard.append("b"))
    assert calls == [1] and subscriber._listening == (a, b)
    a.pause()
    assert subscriber._listening == (b,) and calls == [1]
    b.close()
    assert calls == [1, 0]
    a.resume()
    assert calls == [1, 0, 1] and subscriber._listening == (a,)
    a.close()
    b.close()
    assert calls == [1, 0, 1, 0] and subscriber._listening == () and not subscriber._open
    assert unsubscribed == [1] and subscriber._subscription == []  # the last close gives the subscriber back


def test_the_message_says_whether_cupti_was_detached_when_the_block_started():
    after = _messages.unsampled_message({"stream": 3}, 0, 10, "detached")
    assert "had forgotten the process" in after and "fresh process" not in after
    refused = _messages.unattributed_message(5, 10, "off (GPUSCOPE_PC_DETACH=0)")
    assert "CUPTI was not detached first (off" in refused and "fresh process" in refused


def test_sampling_buffers_are_reused_and_never_freed():
    """CUPTI may write into the last buffer it was given after disable: buffers come from a pool that keeps them."""
    from gpuscope.cupti import pc_sampling as C

    first = C.lease_buffer(7, 3)
    second = C.lease_buffer(7, 3)
    assert first is not second  # two blocks at once (two devices) never share one
    first.data.totalNumPcs = 2
    first.data.totalSamples = 9
    C.return_buffer(first)
    C.return_buffer(first)  # safe twice
    again = C.lease_buffer(7, 3)
    assert again is first and again.data.totalNumPcs == 0 and again.data.totalSamples == 0
    assert C.lease_buffer(7, 3) not in (first, second)  # returned once, leased once
    assert all(b in C._ALL_BUFFERS for b in (first, second))
    a = C.kept_indices(np.array([3, 1], dtype=np.int64))
    assert a.dtype == np.uint32 and C.kept_indices([3, 1]) is a


def test_the_graph_launches_of_a_block_are_kept_for_its_dataset(monkeypatch):
    """The kernels of CUDA graph launches are sampled but are no launches of their own: the block counts the graph
    launches its recorder heard (attr graph_launches), so fast Top-Down can say why it has no range pass for them."""
    from gpuscope.cupti import pc_sampling as C

    class Recorder:
        graph_launches = 10

        def close(self):
            pass

    sampler = P.PCSampler(period=1024, drain_interval=None)
    sampler._state, sampler._context, sampler._buffer = "sampling", _Context(), _Buffer(_records())
    sampler.reason_indices, sampler.reason_names = INDICES, NAMES
    sampler._recorder = Recorder()
    monkeypatch.setattr(P, "_synchronize", lambda ctx: None)
    monkeypatch.setattr(P, "_get_data", lambda ctx, buf: PCRecords.empty())
    monkeypatch.setattr(C, "disable", lambda ctx: None)
    monkeypatch.setattr(P.PCSampler, "build", lambda self: "built")
    monkeypatch.setattr(P.PCSampler, "_settle", lambda self: None)
    sampler.close()
    assert sampler.graph_launches == 10 and sampler._recorder is None
