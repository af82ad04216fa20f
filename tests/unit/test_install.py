"""What each install brings: the analysis-only core, the collection extras, and Numba kernels that compile without a
GPU (docs/quickstart.md#install).

The extras themselves are checked in fresh virtual environments by ``tools/release_check.sh``; these tests check
the declarations, run the analysis with the collection stack hidden, and compile the demo's kernels to PTX.
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging import requirements  # a dependency of matplotlib

ROOT = Path(__file__).resolve().parents[2]
# What collection and Numba bring; the analysis must not need any of them.
COLLECTION = {"numba", "numba-cuda", "llvmlite", "cuda-bindings", "cuda-core", "cuda-python", "cuda-pathfinder",
              "nvtx", "tqdm", "scipy"}


@functools.cache
def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requires(extra: str | None) -> dict[str, requirements.Requirement]:
    """The requirements of the core (None) or of an extra, with gpuscope's own extras that it names expanded."""
    project = _pyproject()["project"]
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    out = {}
    for line in lines:
        req = requirements.Requirement(line)
        if req.name == "gpuscope":
            for inner in sorted(req.extras):
                out.update(_requires(inner))
        else:
            out[req.name] = req
    return out


def test_the_core_is_the_analysis_alone():
    core = _requires(None)
    assert {"numpy", "xarray", "pandas", "matplotlib", "h5netcdf", "h5py"} <= set(core)
    assert not COLLECTION & set(core) and not any(name.startswith("nvidia-") for name in core)


@pytest.mark.parametrize("extra, cupti, bindings", [("cu13", "nvidia-cuda-cupti", "13.0"),
                                                    ("cu12", "nvidia-cuda-cupti-cu12", "12.9")])
def test_the_driver_extras_bring_collection_and_numba_with_its_compilers(extra, cupti, bindings):
    reqs = _requires(extra)
    # numba-cuda's own extra of the same name brings NVRTC, NVVM and the CUDA runtime from pip
    assert reqs["numba-cuda"].extras == {extra}
    assert {cupti, "cuda-bindings", "cuda-pathfinder", "numba", "nvtx", "tqdm"} <= set(reqs)
    assert reqs["cuda-bindings"].specifier.contains(bindings)
    assert not reqs["numpy"].specifier.contains("2.5")  # numba-cuda 0.30.4 cannot compile kernels under NumPy 2.5


def test_offline_and_test_extras():
    offline, test = _requires("offline"), _requires("test")
    assert str(offline["nvidia-cuda-cupti"].specifier) == "==13.1.115"
    assert "numba" not in offline and "cuda-bindings" not in offline
    # the tests compile kernels (cu13's compilers) and check the Welch test against scipy
    assert test["numba-cuda"].extras == {"cu13"} and "scipy" in test and "pytest" in test
    assert str(test["nvidia-cuda-cupti"].specifier) == "==13.1.115"


def test_the_license_is_an_spdx_expression():
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    setuptools = next(requirements.Requirement(r) for r in _pyproject()["build-system"]["requires"]
                      if r.startswith("setuptools"))
    assert not setuptools.specifier.contains("76.9")  # PEP 639 license expressions: setuptools 77


# The collection stack hidden from a child process, as in an install without the cu13/cu12 extras: every import of
# these fails (cuda.pathfinder stays: the offline extra brings it to find CUPTI).
_HIDE = r"""
import importlib.abc, sys
HIDDEN = ("numba", "llvmlite", "cuda.bindings", "cuda.core", "scipy", "nvtx", "tqdm", "cupy")

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, Hide())
"""

_ANALYSIS = r"""
import contextlib, io, json, sys, warnings
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import gpuscope as gs
from gpuscope import cli

out = Path(sys.argv[1])
data = Path(gs.__file__).parent / "data"
launches = gs.open_dataset(data / "demo_launches.nc")
series = gs.open_dataset(data / "demo_timeseries.nc")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's warp-state coverage (issue 37, item 9)
    td = gs.topdown(launches)
per_kernel = gs.aggregate(td, by="kernel")
report = gs.report(launches)
diff = gs.compare(launches, launches)
ph = gs.phases(series)
per_kernel.gpuscope.plot.topdown(level=2).savefig(out / "topdown.png")
gs.save_dataset(td, out / "td.nc")


def run(*argv):
    with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.redirect_stderr(io.StringIO()) as notes:
        code = cli.main(list(argv))
    return code, text.getvalue(), notes.getvalue()


runs = {"demo": run("demo", "--out", str(out / "demo")), "show": run("show", str(data / "demo_launches.nc")),
        "check": run("check", "--json")}
collect = {}  # what collection says without its stack
for name, start in (("Profiler", lambda: gs.Profiler(metrics="topdown")), ("sample", lambda: gs.sample()),
                    ("pc_sample", gs.pc_sample)):
    try:
        with start():
            pass
    except (gs.NoGpuError, gs.CuptiNotFoundError) as exc:
        collect[name] = str(exc)
print(json.dumps({"runs": runs, "collect": collect, "bound_by": dict(zip(report.index, report["bound_by"])),
                  "significant": int(diff["significant"].sum()), "phases": int(ph["phase"].max()) + 1,
                  "hidden": sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite", "scipy"))}))
"""


def test_analysis_and_the_demo_work_without_the_collection_stack(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _HIDE + _ANALYSIS, str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    runs = result["runs"]
    assert runs["demo"][0] == 0 and runs["show"][0] == 0
    assert result["bound_by"]["stream"] == "backend_memory" and result["significant"] == 0
    assert result["phases"] >= 2 and result["hidden"] == []
    assert (tmp_path / "demo" / "topdown.png").stat().st_size > 0 and (tmp_path / "topdown.png").exists()
    assert "No GPU: cuda-bindings is not installed, so gpuscope cannot reach the NVIDIA driver." in runs["demo"][2]
    assert "Top-Down per kernel" in runs["demo"][1] and "backend_memory" in runs["show"][1]
    # collection fails at once, naming the extra that brings what is missing
    assert set(result["collect"]) == {"Profiler", "sample", "pc_sample"}
    assert all("pip install '.[" in text for text in result["collect"].values()), result["collect"]
    # gpuscope check names what is missing and the extra that brings it (after CUPTI, which must load for that)
    code, text, _ = runs["check"]
    if code == 2:
        pytest.skip("no CUPTI that works on this machine (the offline extra's 13.1 does without a driver)")
    why = next(m["why"] for m in json.loads(text)["missing"] if m["what"] == "cuda-bindings")
    assert code == 1
    assert "cuda-bindings is not installed" in why and "pip install '.[cu13]'" in why


_COMPILE = r"""
import sys
try:
    import cuda.pathfinder as pathfinder
    for lib in ("nvrtc", "nvvm"):
        pathfinder.load_nvidia_dynamic_lib(lib)
except Exception as exc:
    print("SKIP", type(exc).__name__, exc)
    raise SystemExit(0)
from gpuscope._commands import demo

for name, text in demo.ptx((9, 0)).items():
    print(name, ".target sm_90" in text, text.count(".entry"), text.count(".loc"))
"""


def test_the_demo_kernels_compile_to_ptx_without_a_gpu():
    """What failed in a cu13 install before numba-cuda[cu13] (issue 37): Numba could not find libnvrtc."""
    pytest.importorskip("numba")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("SKIP"):
        pytest.skip(f"no NVRTC or NVVM here (the cu13 and cu12 extras bring them): {proc.stdout.splitlines()[0]}")
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    assert set(rows) == {"stream", "fma", "divergent"}
    for target, entries, locs in rows.values():
        assert target == "True" and entries == "1" and int(locs) > 0  # one kernel for sm_90, with line info


def test_the_demo_writes_where_git_does_not_track():
    """Issue 37, item 10: ``gpuscope demo`` in a checkout writes gpuscope-demo/ (as the README says), which git
    ignores and does not track."""
    import inspect

    from gpuscope._commands import demo

    assert inspect.signature(demo.main).parameters["outdir"].default == "gpuscope-demo"
    assert "`gpuscope-demo/{topdown,timeline}.png`" in (ROOT / "README.md").read_text()
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    git = ["git", "-C", str(ROOT)]
    assert subprocess.run([*git, "ls-files", "gpuscope-demo"], capture_output=True, text=True).stdout == ""
    assert subprocess.run([*git, "check-ignore", "-q", "gpuscope-demo/topdown.png"]).returncode == 0
