"""`gpuscope run`, `show` and `compare` on the GPU, in subprocesses, on an unmodified script.

python3 -m pytest -m gpu tests/gpu/test_cli_run.py -v     (about a minute on the H100: four profiled runs)
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import gpuscope as gs
from gpuscope.metrics import topdown as td

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tutorials" / "report_workload.py"
RUN = ["run", "--set", "topdown", "--mode", "kernel", "-k", "regex:stream|fma"]  # a row per launch: the t-tests


def gpuscope(*argv, cwd):
    done = subprocess.run([sys.executable, "-m", "gpuscope", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "COLUMNS": "100"})
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in (("base", []), ("again", []), ("slow", ["--slow-fma"])):
        done = gpuscope(*RUN, "-o", folder / f"{name}.nc", SCRIPT, *extra, cwd=folder)
        out[name] = (done, gs.open_dataset(folder / f"{name}.nc"))
    return folder, out


def readable(ds):
    return gs.report(ds).index.tolist()


def test_run_profiles_only_the_selected_kernels_and_prints_the_report(runs):
    _, out = runs
    done, ds = out["base"]
    assert done.returncode == 0, done.stderr
    assert "done: c[0]=" in done.stdout  # the script's own output
    assert ds.sizes["range"] == 20 and ds.attrs["mode"] == "kernel"
    assert sorted(readable(ds)) == ["fma", "stream"]  # scale filtered out by -k
    assert sorted(set(ds.kernel_qualname.values.tolist())) == ["__main__.fma", "__main__.stream"]
    assert "gpuscope report: 20 launches, 2 kernels" in done.stdout


def test_the_verdicts_are_the_topdown_of_the_saved_file(runs):
    _, out = runs
    done, ds = out["base"]
    r = gs.report(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_kernel = td.aggregate(td.topdown(ds).assign_coords(kernel=("range", readable_keys(ds))), by="kernel")
    for k in r.index:
        row = per_kernel.sel(kernel=k)
        level2 = {n: float(row[n]) for n in td.level_cut(2) if n != "retire"}
        assert r.loc[k, "bound_by"] == max(level2, key=level2.get)
    assert r.loc["stream", "bound_by"] == "backend_memory"
    assert r.loc["fma", "bound_by"] == "backend_core"
    for k in r.index:  # the printed report says the same
        line = next(x for x in done.stdout.splitlines() if x.startswith(k))
        assert r.loc[k, "bound_by"] in line


def readable_keys(ds):
    from gpuscope._results.report import group_key

    return group_key(ds)


def test_show_prints_the_same_report(runs):
    folder, out = runs
    done, ds = out["base"]
    shown = gpuscope("show", folder / "base.nc", cwd=folder)
    assert shown.returncode == 0
    text = gs.report(ds).to_text(width=100)  # the subprocesses run with COLUMNS=100
    assert text in shown.stdout
    table = [x for x in text.splitlines() if x.startswith(("fma", "stream"))]
    assert table
    assert all(x in done.stdout for x in table)


def test_compare_flags_nothing_between_two_runs_and_flags_the_slowed_kernel(runs):
    folder, out = runs
    same = gs.compare(out["base"][1], out["again"][1])
    assert not same["significant"].any(), same[same["significant"]]
    slow = gs.compare(out["base"][1], out["slow"][1])
    flagged = slow[slow["significant"]]
    assert ("fma", "gpu_time_us") in flagged.index
    assert slow.loc[("fma", "gpu_time_us"), "relative"] == pytest.approx(50, abs=10)  # percent of the base
    assert ("stream", "gpu_time_us") not in flagged.index
    shown = gpuscope("compare", folder / "base.nc", folder / "slow.nc", cwd=folder)
    # only the differences larger than noise are shown (the significant column may not fit the terminal)
    assert shown.returncode == 0 and "differences are larger than run-to-run noise" in shown.stdout
    assert any(line.startswith("fma") and "gpu_time_us" in line for line in shown.stdout.splitlines())


def test_failing_script_and_empty_filter(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import runpy, sys\nsys.argv = [sys.argv[0]]\n"
                   f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\nraise RuntimeError('after the work')\n")
    done = gpuscope(*RUN, "-o", tmp_path / "partial.nc", bad, cwd=tmp_path)
    assert done.returncode == 1 and "RuntimeError: after the work" in done.stderr
    assert gs.open_dataset(tmp_path / "partial.nc").sizes["range"] == 20
    none = gpuscope("run", "--set", "launch", "-k", "nosuchkernel", SCRIPT, cwd=tmp_path)
    assert none.returncode == 6 and "nothing matched -k nosuchkernel" in none.stderr


def test_the_first_start_beside_the_script_profiles_what_a_start_before_it_does(tmp_path):
    """`gpuscope run` makes the range profiler's first Start on a thread while the script starts (kernel and auto
    modes); GPUSCOPE_FIRST_START_BESIDE=0 makes it before the script. Both profile the same first launches, with the
    same exact counts, in auto mode with -c (as the issue's `-c 3`) and in kernel mode."""
    counts = ["smsp__inst_executed.sum", "sm__ctas_launched.sum", "smsp__thread_inst_executed.sum"]
    for mode in ("auto", "kernel"):
        got = {}
        for name, env in (("beside", {}), ("before", {"GPUSCOPE_FIRST_START_BESIDE": "0"})):
            out = tmp_path / f"{mode}_{name}.nc"
            done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "--metrics", ",".join(counts), "--mode",
                                   mode, "-c", "3", "--no-report", "-o", str(out), str(SCRIPT)], capture_output=True,
                                  text=True, cwd=tmp_path, timeout=300, env={**os.environ, **env})
            assert done.returncode == 0, done.stderr[-3000:]
            got[name] = gs.open_dataset(out)
        beside, before = got["beside"], got["before"]
        assert beside.sizes["range"] == before.sizes["range"] == 3
        assert beside["launch"].values.tolist() == before["launch"].values.tolist() == [0, 1, 2]
        assert beside["kernel"].values.tolist() == before["kernel"].values.tolist()
        for m in counts:
            assert beside[m].values.tolist() == before[m].values.tolist(), m
