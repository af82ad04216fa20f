"""NVTX ranges as rows: torch.cuda.nvtx, emit_nvtx, the nvtx package, nesting, include/exclude, gpuscope.range
beside NVTX, and what is said when NVTX cannot arrive; and ``gpuscope run --nvtx``.

NVTX reads ``NVTX_INJECTION64_PATH`` once, at a library's first NVTX call, so every test runs in a fresh process
that calls ``gs.enable_nvtx()`` before any NVTX call (this pytest process may have made some already).

python3 -m pytest -m gpu tests/gpu/test_nvtx.py -v
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuscope as gs

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
VAR = "NVTX_INJECTION64_PATH"

PREAMBLE = """
    import json, warnings
    import gpuscope as gs
    {enable}
    import torch

    x = torch.randn(1024, 1024, device="cuda")
    (x @ x).sum().item()  # cuBLAS set up before any session

    def result(prof, caught=()):
        ds = prof.dataset
        out = {{"names": [str(n) for n in ds["name"].values],
               "parents": [str(p) for p in ds["parent"].values],
               "cycles": [float(v) for v in ds["sm__cycles_elapsed.max"].values],
               "attrs": {{k: ds.attrs[k] for k in ("nvtx", "nvtx_ranges_heard", "nvtx_ranges_taken")
                         if k in ds.attrs}},
               "warnings": [str(w.message) for w in caught]}}
        print("RESULT", json.dumps(out))
"""


def run(body: str, enable: str = "gs.enable_nvtx()") -> dict:
    code = textwrap.dedent(PREAMBLE.format(enable=enable)) + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != VAR}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(line[-1][len("RESULT "):])


def test_torch_nvtx_ranges_around_torch_ops_are_rows():
    out = run("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gs.Profiler("launch", mode="user", nvtx=True) as prof:
                for _ in range(3):
                    torch.cuda.nvtx.range_push("matmul")
                    y = x @ x
                    torch.cuda.nvtx.range_pop()
                    torch.cuda.nvtx.range_push("relu")
                    torch.relu(y)
                    torch.cuda.nvtx.range_pop()
        result(prof, caught)
    """)
    assert sorted(out["names"]) == ["matmul", "relu"], out
    assert all(c > 0 for c in out["cycles"]), out
    assert out["attrs"] == {"nvtx": "all", "nvtx_ranges_heard": 6, "nvtx_ranges_taken": 6}, out
    assert not [w for w in out["warnings"] if "NVTX" in w], out["warnings"]


def test_nested_torch_nvtx_ranges_are_rows_named_by_path():
    out = run("""
        with gs.Profiler("launch", mode="user", max_depth=2, nvtx=True) as prof:
            for _ in range(4):
                with torch.cuda.nvtx.range("step"):
                    with torch.cuda.nvtx.range("forward"):
                        y = torch.relu(x @ x)
                    with torch.cuda.nvtx.range("loss"):
                        y.sum()
        result(prof)
    """)
    assert set(out["names"]) == {"step", "step/forward", "step/loss"}, out
    assert {n: p for n, p in zip(out["names"], out["parents"])} == {"step": "", "step/forward": "step",
                                                                   "step/loss": "step"}
    assert all(c > 0 for c in out["cycles"]), out


def test_nvtx_package_annotations_in_a_domain_are_rows():
    pytest.importorskip("nvtx")  # the `nvtx` package (pip install nvtx); the device carries its wheel
    out = run("""
        import nvtx
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gs.Profiler("launch", mode="user", max_depth=2, nvtx=["app@outer"]) as prof:
                for _ in range(2):
                    with nvtx.annotate("outer", domain="app"):
                        with nvtx.annotate("inner"):  # default domain, nested in app's "outer": taken
                            x @ x
                    with nvtx.annotate("outer"):  # the default domain's "outer": not app's, not taken
                        x @ x
        result(prof, caught)
    """)
    assert set(out["names"]) == {"outer", "outer/inner"}, out
    assert out["attrs"]["nvtx_ranges_heard"] == 6 and out["attrs"]["nvtx_ranges_taken"] == 4, out
    assert not [w for w in out["warnings"] if "NVTX" in w or "registered" in w], out["warnings"]


def test_include_and_exclude_select_nvtx_ranges():
    out = run("""
        push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        with gs.Profiler("launch", mode="user", max_depth=2, nvtx="step", nvtx_exclude="*/skip") as prof:
            for _ in range(2):
                push("warmup"); x @ x; pop()              # not included
                push("step")
                push("fwd"); x @ x; pop()                 # included with its parent
                push("skip"); push("mm"); x @ x; pop(); pop()  # excluded, and what is nested in it
                pop()
        result(prof)
    """)
    assert set(out["names"]) == {"step", "step/fwd"}, out
    assert out["attrs"] == {"nvtx": "include step; exclude */skip", "nvtx_ranges_heard": 10,
                            "nvtx_ranges_taken": 4}, out


def test_gpuscope_ranges_beside_nvtx_ranges_are_not_rows_twice():
    out = run("""
        with gs.Profiler("launch", mode="user", max_depth=2, nvtx=True) as prof:
            for _ in range(2):
                with gs.range("step"):  # also an NVTX range of domain "gpuscope", which is not taken again
                    torch.cuda.nvtx.range_push("fwd")
                    x @ x
                    torch.cuda.nvtx.range_pop()
        result(prof)
    """)
    assert sorted(set(out["names"])) == ["step", "step/fwd"] and len(out["names"]) == 2, out
    assert out["attrs"]["nvtx_ranges_heard"] == 2, out


def test_emit_nvtx_operator_ranges_are_rows():
    out = run("""
        with torch.no_grad(), torch.autograd.profiler.emit_nvtx():
            with gs.Profiler("launch", mode="user", nvtx="aten::mm*") as prof:
                for _ in range(3):
                    torch.mm(x, x)
        result(prof)
    """)
    assert out["names"] and all(n.startswith("aten::mm") for n in out["names"]), out
    assert all(c > 0 for c in out["cycles"]), out


def test_without_enable_nvtx_a_session_is_refused_with_what_to_do():
    out = run("""
        try:
            gs.Profiler("launch", mode="user", nvtx=True)
        except gs.NvtxUnavailableError as exc:
            print("RESULT", json.dumps({"refused": str(exc)}))
    """, enable="")
    assert "NVTX_INJECTION64_PATH is not set" in out["refused"] and "enable_nvtx" in out["refused"], out


def test_nvtx_started_before_enable_nvtx_is_said_by_enable_nvtx():
    pytest.importorskip("nvtx")  # the `nvtx` package (pip install nvtx); the device carries its wheel
    out = run("""
        print("RESULT", json.dumps({"said": said}))
    """, enable="""
    import nvtx, warnings as w0
    nvtx.push_range("too early"); nvtx.pop_range()  # the nvtx package's NVTX starts without a tool
    with w0.catch_warnings(record=True) as early:
        w0.simplefilter("always")
        gs.enable_nvtx()
    said = [str(w.message) for w in early]
    """)
    said = " | ".join(out["said"])
    assert "made NVTX calls before gpuscope.enable_nvtx()" in said, said


def test_nvtx_started_before_enable_nvtx_is_said_by_the_session():
    pytest.importorskip("nvtx")  # the `nvtx` package (pip install nvtx); the device carries its wheel
    out = run("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with gs.Profiler("launch", mode="user", nvtx=True):
                pass
        print("RESULT", json.dumps({"said": [str(w.message) for w in caught]}))
    """, enable="""
    import nvtx
    nvtx.push_range("too early"); nvtx.pop_range()
    import os; from gpuscope._range_profiling.nvtx import _cupti_path
    os.environ["NVTX_INJECTION64_PATH"] = _cupti_path()  # set by hand: gpuscope.enable_nvtx would warn already
    """)
    said = " | ".join(out["said"])
    assert "do not reach gpuscope" in said and "No NVTX range was heard" in said, said


def test_gpuscope_run_nvtx_takes_an_unmodified_scripts_ranges(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        x = torch.randn(1024, 1024, device="cuda")
        for _ in range(3):
            torch.cuda.nvtx.range_push("step")
            torch.relu(x @ x)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print("trained")
    """))
    env = {k: v for k, v in os.environ.items() if k != VAR}
    done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "--set", "launch", "--mode", "user", "--nvtx",
                           "--no-report", "-o", str(tmp_path / "out.nc"), str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    ds = gs.open_dataset(tmp_path / "out.nc")
    assert [str(n) for n in ds["name"].values] == ["step"], ds
    assert ds.attrs["nvtx"] == "all" and ds.attrs["nvtx_ranges_taken"] == 3
