"""`gpuscope run` without a GPU: the real script execution, with a fake Profiler that returns an H100 recording."""

import json
import subprocess
import sys
import textwrap
import threading

import pytest

import gpuscope as gs
from gpuscope._gpu import metric_lists as _lists
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._commands import run as _run
from gpuscope._range_profiling import session as _session


class FakeProfiler:
    """Records how it was made and used; its dataset is the demo's H100 recording (or an empty selection)."""

    made: list = []

    def __init__(self, metrics, device=0, *, mode="user", kernels=None, exclude=None, launch_skip=0,
                 launch_count=None):
        self.args = {"metrics": metrics, "device": device, "mode": mode, "kernels": kernels, "exclude": exclude,
                     "launch_skip": launch_skip, "launch_count": launch_count}
        self.events = []
        FakeProfiler.made.append(self)

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False

    @property
    def dataset(self):
        ds = gs.open_dataset(_demo.RECORDED_LAUNCHES)
        if self.args["kernels"] == ["nomatch"]:
            return ds.isel(range=slice(0, 0))
        return ds


class NewerProfiler(FakeProfiler):
    """A FakeProfiler that also takes the newer options, recorded in ``args``."""

    def __init__(self, metrics, device=0, *, first_start_beside=False, pass_groups=None, graphs=None, **kwargs):
        super().__init__(metrics, device, **kwargs)
        self.args.update(first_start_beside=first_start_beside, pass_groups=pass_groups, graphs=graphs)


@pytest.fixture
def fake(monkeypatch):
    FakeProfiler.made = []
    monkeypatch.setattr(_session, "Profiler", FakeProfiler)
    return FakeProfiler


def script(tmp_path, body, name="work.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


ECHO = """
    import json, os, sys
    seen = {"argv": sys.argv, "name": __name__, "path0": sys.path[0]}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json"), "w") as f:
        json.dump(seen, f)
    print("script says hi")
"""


def test_script_runs_as_main_with_its_argv(fake, tmp_path, capsys):
    path = script(tmp_path, ECHO)
    code = cli.main(["run", "--set", "topdown", "-o", str(tmp_path / "out.nc"), str(path), "--lr", "0.1", "-k", "x"])
    out = capsys.readouterr()
    assert code == 0
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [str(path), "--lr", "0.1", "-k", "x"], "name": "__main__", "path0": str(tmp_path)}
    assert sys.argv[0] != str(path)  # restored
    # the report printed after the script's own output
    assert out.out.index("script says hi") < out.out.index("gpuscope report: 15 launches, 3 kernels")
    assert "backend_memory" in out.out and f"saved {tmp_path / 'out.nc'}" in out.err
    saved = gs.open_dataset(tmp_path / "out.nc")
    assert saved.sizes["range"] == 15
    (prof,) = fake.made
    assert prof.events == ["enter", "exit"]
    assert prof.args["metrics"] == "topdown" and prof.args["mode"] == "auto"
    assert prof.args["kernels"] is None  # not given: not passed


def test_filters_and_metric_lists_are_passed(fake, tmp_path, capsys):
    path = script(tmp_path, "pass\n")
    code = cli.main(["run", "--metrics", "topdown,launch", "-k", "stream,regex:fma|div", "-k", "other",
                     "--exclude", "warmup", "--launch-skip", "2", "--launch-count", "10", "--mode", "user",
                     "--no-report", str(path)])
    assert code == 0 and "gpuscope report" not in capsys.readouterr().out
    args = fake.made[0].args
    assert args["kernels"] == ["stream", "regex:fma|div", "other"] and args["exclude"] == ["warmup"]
    assert (args["launch_skip"], args["launch_count"], args["mode"]) == (2, 10, "user")
    # the sets stay names, so that the session takes each as its chip collects it
    assert args["metrics"] == ["topdown", "launch"]
    metrics = _lists.resolve(args["metrics"], "GH100")
    assert metrics[0] == gs.metric_set("topdown").metrics[0] and "sm__ctas_launched.sum" in metrics
    assert len(metrics) == len(set(metrics))  # the sets' shared metrics once


def test_an_exception_prints_its_traceback_exits_1_and_saves(fake, tmp_path, capsys):
    path = script(tmp_path, """
        def step():
            raise RuntimeError("diverged at step 3")
        step()
    """)
    code = cli.main(["run", "-o", str(tmp_path / "partial.nc"), str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last)" in err and "RuntimeError: diverged at step 3" in err
    assert f'File "{path}", line 4' in err and "runpy" not in err and "_run.py" not in err
    assert "the script failed" in err and gs.open_dataset(tmp_path / "partial.nc").sizes["range"] == 15
    assert fake.made[0].events == ["enter", "exit"]


@pytest.mark.parametrize("body,code,err", [("import sys; sys.exit(3)", 3, ""), ("raise SystemExit", 0, ""),
                                           ("import sys; sys.exit('bad input file')", 1, "bad input file")])
def test_exit_status_passes_through(fake, tmp_path, capsys, body, code, err):
    path = script(tmp_path, body + "\n")
    assert cli.main(["run", "--no-report", str(path)]) == code
    assert err in capsys.readouterr().err


def test_a_filter_that_matches_nothing(fake, tmp_path, capsys):
    path = script(tmp_path, "pass\n")
    code = cli.main(["run", "-k", "nomatch", "-o", str(tmp_path / "empty.nc"), str(path)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_NOTHING_PROFILED == _run.EXIT_NOTHING_PROFILED
    assert "no kernel launch was profiled: nothing matched -k nomatch" in err
    assert gs.open_dataset(tmp_path / "empty.nc").sizes["range"] == 0  # saved all the same


def test_a_failing_script_keeps_its_status_when_nothing_matched(fake, tmp_path, capsys):
    path = script(tmp_path, "import sys; sys.exit(7)\n")
    assert cli.main(["run", "-k", "nomatch", str(path)]) == 7


@pytest.mark.parametrize(
    "argv,code,needle",
    [
        (["run", "--set", "topdown", "--sample", "pm-default@100us", "S"], cli.EXIT_USAGE, "not allowed with"),
        (["run", "missing_script.py"], cli.EXIT_USAGE, "No script 'missing_script.py'"),
        (["run", "--set", "pm-default", "S"], cli.EXIT_USAGE, "--sample pm-default@100us"),
        (["run", "--sample", "pm-default", "-k", "stream", "S"], cli.EXIT_USAGE, "PM sampling (--sample) covers"),
        (["run", "--launch-count", "-1", "S"], cli.EXIT_USAGE, "negative"),
        (["run", "-o", "/proc/nope/out.nc", "S"], cli.EXIT_FILE, "its folder /proc/nope does not exist"),
        (["run", "-o", "EXISTS", "S"], cli.EXIT_USAGE, "exists: gpuscope run does not overwrite it"),
        (["run", "--trace", "EXISTS", "S"], cli.EXIT_USAGE, "give --trace another name"),
    ],
)
def test_refused_before_the_script_starts(fake, tmp_path, capsys, argv, code, needle):
    path = script(tmp_path, "open('ran', 'w').write('yes')\n")
    (tmp_path / "old.nc").write_text("results of an earlier run")
    argv = [str(path) if a == "S" else str(tmp_path / "old.nc") if a == "EXISTS" else a for a in argv]
    assert status(argv) == code
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not fake.made and not (tmp_path / "ran").exists()


def status(argv):
    """The exit status of the command, whether main returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


def test_sampling_runs_the_sampler(monkeypatch, tmp_path, capsys):
    made = []

    class FakeSampler(FakeProfiler):
        def __init__(self, metrics, interval, device=0, **extra):
            self.args = {"metrics": metrics, "interval": interval, "device": device, **extra}
            self.events = []
            made.append(self)

        @property
        def dataset(self):
            return gs.open_dataset(_demo.RECORDED_SERIES)

    monkeypatch.setattr("gpuscope._pm_sampling.api.sample", FakeSampler)
    path = script(tmp_path, "pass\n")
    assert cli.main(["run", "--sample", "pm-default@20us", str(path)]) == 0
    assert made[0].args == {"metrics": "pm-default", "interval": "20us", "device": 0}
    assert "gpuscope report: PM sampling, 18019 samples" in capsys.readouterr().out
    assert cli.main(["run", "--sample", "pm-fast", "--kernel-times", str(path)]) == 0
    assert made[1].args == {"metrics": "pm-fast", "interval": "100us", "device": 0, "kernels": True}
    capsys.readouterr()
    assert status(["run", "--kernel-times", str(path)]) == cli.EXIT_USAGE
    assert "--kernel-times goes with --sample" in capsys.readouterr().err


def test_unsupported_filters_are_a_clear_message(monkeypatch, tmp_path, capsys):
    class OldProfiler(FakeProfiler):
        def __init__(self, metrics="launch", device=0, *, mode="user"):
            super().__init__(metrics, device, mode=mode)

    monkeypatch.setattr(_session, "Profiler", OldProfiler)
    path = script(tmp_path, "pass\n")
    assert cli.main(["run", "-k", "stream", str(path)]) == cli.EXIT_USAGE
    assert "does not support -k/--kernels yet" in capsys.readouterr().err


def test_python_dash_m_gpuscope(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "--set", "topdown", "--sample", "pm-default",
                           "x.py"], capture_output=True, text=True)
    assert done.returncode == cli.EXIT_USAGE and "not allowed with" in done.stderr


def test_trace_of_the_run(fake, tmp_path, capsys):
    path = script(tmp_path, ECHO)
    trace = tmp_path / "run.json"
    code = cli.main(["run", "--trace", str(trace), str(path)])
    assert code == 0 and f"wrote {trace}" in capsys.readouterr().err
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X"]
    assert len(slices) == 15  # the recording's 15 launches, one slice each
    assert {e["name"] for e in slices} == {"stream", "fma", "divergent"}
    assert cli.main(["run", "--trace", "/proc/nope/run.json", str(path)]) == cli.EXIT_FILE


def test_force_overwrites_the_output(fake, tmp_path, capsys):
    path = script(tmp_path, ECHO)
    out = tmp_path / "out.nc"
    out.write_text("results of an earlier run")
    assert cli.main(["run", "-f", "-o", str(out), str(path)]) == 0
    assert gs.open_dataset(out).sizes["range"] == 15


MODULE_ECHO = """
    import json, os, sys
    from . import helper  # a relative import: the module runs inside its package
    seen = {"argv": sys.argv, "name": __name__, "spec": __spec__.name, "path0": sys.path[0],
            "main": sys.modules["__main__"].__dict__.get("MARK"), "helper": helper.VALUE}
    MARK = "this module is __main__"
    seen["main"] = sys.modules["__main__"].MARK
    with open("seen.json", "w") as f:
        json.dump(seen, f)
"""


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package in the current folder, as `python -m pkg.train` finds it; its __init__ notes whether the session
    had started when it was imported."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import json, gpuscope._range_profiling.session as s\n"
                                     "json.dump(s.Profiler.made[-1].events, open('init_events.json', 'w'))\n")
    (pkg / "helper.py").write_text("VALUE = 42\n")
    (pkg / "train.py").write_text(textwrap.dedent(MODULE_ECHO))
    (pkg / "__main__.py").write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    (pkg / "fails.py").write_text("def step():\n    raise RuntimeError('diverged')\n\nstep()\n")
    monkeypatch.chdir(tmp_path)
    yield pkg
    for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:  # each test has its own pkg
        del sys.modules[name]


def test_dash_m_runs_a_module_as_python_dash_m(fake, package, tmp_path, capsys):
    saved_argv, saved_path0 = sys.argv[:], sys.path[0]
    code = cli.main(["run", "-k", "stream", "-m", "pkg.train", "--lr", "0.1", "-k", "x"])
    assert code == 0 and "gpuscope report: 15 launches" in capsys.readouterr().out
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"argv": [str(package / "train.py"), "--lr", "0.1", "-k", "x"], "name": "__main__",
                    "spec": "pkg.train", "path0": str(tmp_path), "main": "this module is __main__", "helper": 42}
    assert fake.made[0].args["kernels"] == ["stream"]  # options before -m are gpuscope's
    # the package was imported inside the session, not while gpuscope looked for the module
    assert json.loads((tmp_path / "init_events.json").read_text()) == ["enter"]
    assert sys.argv == saved_argv and sys.path[0] == saved_path0 and "MARK" not in vars(sys.modules["__main__"])


def test_dash_m_runs_a_packages_main_and_passes_its_status(fake, package):
    assert cli.main(["run", "--no-report", "-m", "pkg", "3"]) == 3


def test_dash_m_traceback_is_the_modules(fake, package, capsys):
    assert cli.main(["run", "--no-report", "-m", "pkg.fails"]) == 1
    err = capsys.readouterr().err
    assert f'File "{package / "fails.py"}", line 4' in err and "RuntimeError: diverged" in err
    assert "runpy" not in err and "_run.py" not in err


@pytest.mark.parametrize("argv,needle", [
    (["run", "-m", "pkg.missing"], "No module named 'pkg.missing' with the current folder"),
    (["run", "-m", "nosuchpackage_gpuscope"], "No module named 'nosuchpackage_gpuscope'"),
    (["run", "-m", "pkg.helper.deeper"], "No module named 'pkg.helper.deeper'"),
    (["run", "-m", "pkg/train.py"], "is not a module name"),
    (["run", "-m"], "-m needs the module to run"),
    (["run"], "Give what to profile"),
])
def test_dash_m_refused_before_anything_runs(fake, package, tmp_path, capsys, argv, needle):
    (package / "__main__.py").unlink()
    assert status(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not fake.made and not (tmp_path / "init_events.json").exists()  # nothing imported, nothing started
    assert status(["run", "-m", "pkg"]) == cli.EXIT_USAGE
    assert "'pkg' is a package and cannot be run directly" in capsys.readouterr().err


def test_results_modules_load_while_the_session_starts_and_no_thread_is_left_for_the_script(
        fake, tmp_path, monkeypatch):
    """The results' modules (xarray, the report) are imported on a thread during the session's start, whose CUDA and
    CUPTI calls release the GIL; the thread has ended before the script runs, so a script that forks inherits no
    import lock."""
    gate, order = threading.Event(), []
    (tmp_path / "results_stand_in.py").write_text(
        "import sys\nsys._gpuscope_test_order.append('import begins')\nsys._gpuscope_test_gate.wait(10)\n"
        "sys._gpuscope_test_order.append('import ends')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "_gpuscope_test_gate", gate, raising=False)
    monkeypatch.setattr(sys, "_gpuscope_test_order", order, raising=False)
    monkeypatch.setattr(_run, "_RESULTS_MODULES", ("results_stand_in",))

    class Watching(FakeProfiler):
        def __enter__(self):
            order.append("session enters")
            gate.set()  # the import thread was waiting: it ran beside the session's start
            return super().__enter__()

    monkeypatch.setattr(_session, "Profiler", Watching)
    path = script(tmp_path, """
        import sys, threading
        sys._gpuscope_test_order.append(("script", [t.name for t in threading.enumerate()]))
    """)
    assert cli.main(["run", "--no-report", str(path)]) == 0
    # the import waits for the session's start (the gate), and has ended before the script
    assert sorted(map(str, order[:3])) == ["import begins", "import ends", "session enters"]
    assert order.index("session enters") < order.index("import ends")
    assert order[3][0] == "script" and "gpuscope-run-imports" not in order[3][1]


def test_the_session_is_made_with_its_first_start_beside_the_script_unless_turned_off(monkeypatch, tmp_path, capsys):
    """``gpuscope run`` asks the Profiler at construction for the first Start beside the script (so that it leaves
    the availability query to that thread too); GPUSCOPE_FIRST_START_BESIDE=0 does not, nor is a Profiler without
    the option given it."""
    monkeypatch.setattr(_session, "Profiler", NewerProfiler)
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    path = script(tmp_path, "pass\n")
    FakeProfiler.made = []
    assert cli.main(["run", "--no-report", str(path)]) == 0
    monkeypatch.setenv(_run.FIRST_START_VAR, "0")
    assert cli.main(["run", "--no-report", str(path)]) == 0
    assert [p.args["first_start_beside"] for p in FakeProfiler.made] == [True, False]
    monkeypatch.delenv(_run.FIRST_START_VAR)
    monkeypatch.setattr(_session, "Profiler", FakeProfiler)
    assert cli.main(["run", "--no-report", str(path)]) == 0  # no such option: not given
    assert "first_start_beside" not in FakeProfiler.made[-1].args
    capsys.readouterr()


def test_pass_groups_go_to_the_profiler_and_not_with_sampling(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_session, "Profiler", NewerProfiler)
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    path = script(tmp_path, "pass\n")
    FakeProfiler.made = []
    for groups in ("ncu", "cupti", "plan"):
        assert cli.main(["run", "--no-report", "--pass-groups", groups, str(path)]) == 0
    assert cli.main(["run", "--no-report", str(path)]) == 0
    assert [p.args["pass_groups"] for p in FakeProfiler.made] == ["ncu", "cupti", None, None]
    capsys.readouterr()
    assert cli.main(["run", "--pass-groups", "ncu", "--sample", "pm-fast", str(path)]) == cli.EXIT_USAGE
    assert "--pass-groups lays out range profiling's passes" in capsys.readouterr().err
    monkeypatch.setattr(_session, "Profiler", FakeProfiler)  # a Profiler without the option: a clear message
    assert cli.main(["run", "--pass-groups", "ncu", str(path)]) == cli.EXIT_USAGE
    assert "does not support --pass-groups" in capsys.readouterr().err


def test_graph_profiling_goes_to_the_profiler(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_session, "Profiler", NewerProfiler)
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    path = script(tmp_path, "pass\n")
    FakeProfiler.made = []
    for mode in ("graph", "node"):
        assert cli.main(["run", "--no-report", "--graph-profiling", mode, str(path)]) == 0
    assert [p.args.get("graphs") for p in FakeProfiler.made] == ["graph", None]  # node: the Profiler's default
    capsys.readouterr()


def test_jax_reserve_is_turned_off_for_kernel_replay_unless_the_user_chose(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_session, "Profiler", NewerProfiler)
    monkeypatch.setenv(_run.RESULTS_PROCESS_VAR, "0")
    path = script(tmp_path, "import os\nprint('reserve', os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))\n")
    monkeypatch.delenv(_run.XLA_PREALLOCATE_VAR, raising=False)
    assert cli.main(["run", "--no-report", "--mode", "kernel", str(path)]) == 0
    assert "reserve false" in capsys.readouterr().out
    monkeypatch.setenv(_run.XLA_PREALLOCATE_VAR, "true")  # the user's choice stands
    assert cli.main(["run", "--no-report", "--mode", "kernel", str(path)]) == 0
    assert "reserve true" in capsys.readouterr().out
