"""gpuscope run's results process (gpuscope/_commands/results_worker.py): the Dataset built, saved and reported
in a process of its own from the session's plain data, the same as the run would make them itself; and whatever
goes wrong with that process, the run makes them itself."""

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import results_worker as _worker
from gpuscope._commands import run as _run
from gpuscope._gpu.device import DeviceInfo
from gpuscope._range_profiling import session as _session

METRICS = ["gpu__time_duration.sum", "smsp__inst_executed.sum", "sm__cycles_elapsed.max"]


def _inputs(n=6):
    """A kernel-mode session's data as gpuscope.Profiler.dataset_inputs gives it: two kernels, n launches."""
    rng = np.random.default_rng(3)
    records = [{"name": k, "kernel": k, "symbol": f"_Z{len(k)}{k}v", "launch": i, "depth": 1, "parent": "",
                "values": [float(v) for v in rng.uniform(1e3, 1e6, len(METRICS))], "grid": (128, 1, 1),
                "block": (256, 1, 1), "registers_per_thread": 32, "replay": "kernel"}
               for i, k in enumerate(["stream", "fma"] * (n // 2))]
    device = DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132,
                        memory_bytes=80 << 30, sm_clock_khz=1980000, memory_clock_khz=2619000,
                        pci_bus_id="0000:19:00.0")
    properties = {m: {"units": "nsecond" if "duration" in m else "", "description": m} for m in METRICS}
    device_attrs = {"chip": "GH100", "gpuscope_version": gs.__version__, "cupti_version": "13.0",
                    "created": "2026-11-26T12:00:00+00:00", "driver_cuda_version": "13.0", "device_index": 0,
                    "device_name": device.name, "compute_capability": "9.0", "sm_count": 132,
                    "sm_clock_khz": device.sm_clock_khz, "memory_clock_khz": device.memory_clock_khz,
                    "memory_bytes": device.memory_bytes}  # as the run makes them (Profiler.dataset_inputs)
    return {"records": records, "metrics": METRICS, "properties": properties, "device_info": device,
            "chip": "GH100", "attrs": {"metric_set": "", "mode": "kernel", "mode_requested": "kernel", "passes": 1},
            "device_attrs": device_attrs, "formulas": {"sm__cycles_elapsed.max": "a formula"}}


class Recorded:
    """A closed session whose data is _inputs(): it gives its Dataset's inputs, as gpuscope.Profiler does."""

    made: list = []

    def __init__(self, metrics, device=0, *, mode="user", **filters):
        self.n = 0 if filters.get("kernels") == ["nomatch"] else 6
        Recorded.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def dataset_inputs(self):
        return _inputs(self.n)

    @property
    def dataset(self):
        return _session.build_dataset(self.dataset_inputs())


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    Recorded.made = []
    monkeypatch.setattr(_session, "Profiler", Recorded)
    path = tmp_path / "work.py"
    path.write_text("print('script says hi')\n")
    return path


def _undated(text: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", "(when)", text)


def test_the_dataset_of_the_inputs_is_the_sessions():
    ds = _session.build_dataset(_inputs())
    assert ds.sizes["range"] == 6 and list(ds["kernel"].values[:2]) == ["stream", "fma"]
    assert ds["sm__cycles_elapsed.max"].attrs["formula"] == "a formula"
    assert ds.attrs["compute_capability"] == "9.0" and ds.attrs["mode"] == "kernel"


def test_the_results_process_reports_and_saves_what_the_run_would(recorded, tmp_path, capsys, monkeypatch):
    assert cli.main(["run", "-o", str(tmp_path / "a.nc"), "--trace", str(tmp_path / "a.json"), str(recorded)]) == 0
    there = capsys.readouterr()
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    assert cli.main(["run", "-o", str(tmp_path / "b.nc"), "--trace", str(tmp_path / "b.json"), str(recorded)]) == 0
    here = capsys.readouterr()
    assert "script says hi" in there.out and "stream" in there.out and "fma" in there.out
    assert _undated(there.out) == _undated(here.out)  # the same report, but for when each Dataset was made
    assert there.err.replace("a.", "b.") == here.err and "saved" in there.err and "wrote" in there.err
    a, b = gs.open_dataset(tmp_path / "a.nc"), gs.open_dataset(tmp_path / "b.nc")
    for name in METRICS:
        np.testing.assert_array_equal(a[name].values, b[name].values)
    assert {k: v for k, v in a.attrs.items() if "created" not in k} == {
        k: v for k, v in b.attrs.items() if "created" not in k}


def test_nothing_profiled_is_said_by_the_results_process_too(recorded, capsys):
    assert cli.main(["run", "-k", "nomatch", str(recorded)]) == _run.EXIT_NOTHING_PROFILED
    assert "nothing matched -k nomatch" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["import sys; sys.exit(3)", "import sys; sys.stdout.write('garbage')",
                                     "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
def test_a_results_process_that_fails_leaves_the_results_to_the_run(recorded, capsys, monkeypatch, command):
    started = []

    def broken(imports=()):
        proc = subprocess.Popen([sys.executable, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        return _worker.ResultsWorker(proc)

    monkeypatch.setattr(_worker.ResultsWorker, "start", staticmethod(broken))
    assert cli.main(["run", str(recorded)]) == 0
    out = capsys.readouterr()
    assert "stream" in out.out and "fma" in out.out  # the report, made here
    assert "warning: the results process" in out.err and "making the results in this process" in out.err
    assert started[0].poll() is not None  # nothing left running


class Unsavable(Recorded):
    """A session whose Dataset has an attr that netCDF cannot store: the save fails with a ValueError."""

    def dataset_inputs(self):
        return {**_inputs(self.n), "attrs": {**_inputs(self.n)["attrs"], "odd": {1, 2}}}


def test_a_results_process_that_answers_with_an_error_leaves_it_to_the_run(recorded, capsys, monkeypatch, tmp_path):
    """The worker's error (here: an attr that cannot be saved) is the run's own error too; the report it sent before
    the save is printed once, and the run does only what the worker did not finish."""
    monkeypatch.setattr(_session, "Profiler", Unsavable)
    assert cli.main(["run", "-o", str(tmp_path / "r.nc"), str(recorded)]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert "warning: the results process failed (ValueError" in err and "gpuscope run: error: attr 'odd'" in err
    assert out.count("gpuscope report") == 1 and not (tmp_path / "r.nc").exists()


def test_a_folder_gone_during_the_script_costs_the_file_and_says_so(recorded, capsys, tmp_path):
    """A write that fails is said on one line and exits 5 (EXIT_FILE), after the report; the results process does
    not fail for it."""
    out = tmp_path / "gone" / "r.nc"
    out.parent.mkdir()
    recorded.write_text(f"import shutil\nshutil.rmtree({str(out.parent)!r})\n")
    assert cli.main(["run", "-o", str(out), str(recorded)]) == cli.EXIT_FILE
    printed = capsys.readouterr()
    assert "stream" in printed.out and "warning" not in printed.err
    assert f"gpuscope run: error: {out} (-o) was not written: its folder {out.parent} does not exist" in printed.err


def test_stand_in_and_sampling_sessions_make_their_results_in_the_run(monkeypatch):
    assert _run._results_worker(_run.RunOptions(script="s.py", sample=("pm-default", "100us")), None) is None

    class NoInputs:
        pass

    assert _run._results_worker(_run.RunOptions(script="s.py"), NoInputs) is None
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    assert _run._results_worker(_run.RunOptions(script="s.py"), Recorded) is None


def test_the_run_process_does_not_import_xarray_when_the_results_process_makes_them(tmp_path):
    """The point of the results process: the profiled process never pays xarray's and pandas' import."""
    script = tmp_path / "work.py"
    script.write_text("pass\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from gpuscope._range_profiling import session as _session
        import test_stand_in
        _session.Profiler = test_stand_in.Recorded
        from gpuscope import cli
        code = cli.main(["run", {str(script)!r}])
        print("IMPORTED", code, "xarray" in sys.modules, "pandas" in sys.modules)
    """)
    (tmp_path / "test_stand_in.py").write_text(
        "import sys\nsys.path.insert(0, " + repr(str(__import__('pathlib').Path(__file__).parent)) + ")\n"
        "from test_run_results_worker import Recorded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("IMPORTED"))
    assert line == "IMPORTED 0 False False", done.stderr[-2000:]


def test_the_results_process_outlives_ctrl_c_and_never_outlives_the_run():
    """Ctrl-C (SIGINT to the whole process group) stops the script, not the results the run still wants; the run
    stops the process whatever happened (close), and a process whose run died reads the end of its input and
    ends."""
    import os
    import signal
    import time

    worker = _worker.ResultsWorker.start()
    try:
        time.sleep(0.5)  # its first lines have run
        os.kill(worker._proc.pid, signal.SIGINT)
        code, lines = worker.results(_inputs(), {"code": 0, "report": True, "width": 100})
        assert code == 0 and lines[0][0] == "out" and "stream" in lines[0][1]
    finally:
        worker.close()
    assert worker._proc.poll() is not None
    orphan = _worker.ResultsWorker.start()
    orphan._proc.stdin.close()  # what the run's death does: the end of its input
    assert orphan._proc.wait(timeout=60) == 0
    orphan.close()


def test_the_results_are_made_without_cuda_or_cupti():
    """The results process builds, saves and reports from the run's data alone: it loads no CUPTI and no CUDA driver
    binding (the device attrs come from the run)."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        from test_run_results_worker import _inputs
        from gpuscope._commands import results_worker as W
        from gpuscope._range_profiling.session import build_dataset
        from gpuscope.cupti import _lib
        status, lines = W.results(build_dataset(_inputs()), {{"code": 0, "report": True, "width": 100}})
        print("LOADED", _lib._loaded is not None, "cuda.bindings.driver" in sys.modules, "fma" in lines[0][1])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOADED"))
    assert line == "LOADED False False True", done.stderr[-2000:]


def test_what_the_options_need_is_imported_early_and_a_missing_module_is_left_to_the_save():
    worker = _worker.ResultsWorker.start(("h5netcdf", "no_such_module_for_gpuscope"))
    try:
        code, lines = worker.results(_inputs(), {"code": 0, "report": True, "width": 100})
        assert code == 0 and "fma" in lines[0][1]
    finally:
        worker.close()


def test_a_run_that_saves_warms_the_save_up_on_a_file_it_removes(tmp_path, monkeypatch):
    import tempfile

    from gpuscope._results import io as _io

    saved = []
    real = _io.save_dataset

    def watched(ds, path):
        real(ds, path)
        saved.append((path, gs.open_dataset(path).sizes["range"]))

    monkeypatch.setattr(_io, "save_dataset", watched)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _worker._warm(save=False)
    assert saved == []
    _worker._warm(save=True)
    assert len(saved) == 1 and saved[0][1] == 1 and saved[0][0].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # removed at once


def test_run_html_writes_the_page_of_the_results_after_the_report(recorded, tmp_path, capsys, monkeypatch):
    """gpuscope run --html: the report's page, written as the run's other files are (resolved before the script,
    an existing file kept without -f, a failed write said and exit 5), in the results process and in the run."""
    pytest.importorskip("plotly")
    pytest.importorskip("itables")
    for process in ("1", "0"):
        monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, process)
        page = tmp_path / f"run{process}.html"
        assert cli.main(["run", "--html", str(page), str(recorded)]) == 0
        err = capsys.readouterr().err
        assert f"wrote {page}" in err
        text = page.read_text()
        assert text.startswith("<!DOCTYPE html>") and "stream" in text and "fma" in text
    page.write_text("mine")
    assert cli.main(["run", "--html", str(page), str(recorded)]) != 0  # refused before the script ran
    err = capsys.readouterr().err
    assert page.read_text() == "mine" and "--html" in err and "script says hi" not in err
    assert cli.main(["run", "-f", "--html", str(page), str(recorded)]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
