"""`gpuscope run --nvtx / --nvtx-include / --nvtx-exclude` without a GPU: the options reach the Profiler, NVTX is
routed to CUPTI before the script starts and the variable is as before once it has run; bad uses are refused before
the script starts."""

import json
import os
import sys
import textwrap

import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._range_profiling import nvtx as _nvtx
from gpuscope._range_profiling import session as _session

SEEN = """
    import json, os
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json"), "w") as f:
        json.dump(os.environ.get("NVTX_INJECTION64_PATH"), f)
"""


class NvtxProfiler:
    """Records the options it was made with; its dataset is the demo's H100 recording."""

    made: list = []

    def __init__(self, metrics, device=0, **options):
        self.options = options
        NvtxProfiler.made.append(self)

    def __enter__(self):
        self.env_at_start = os.environ.get(_nvtx.INJECTION_VAR)
        return self

    def __exit__(self, *exc):
        return False

    @property
    def dataset(self):
        return gs.open_dataset(_demo.RECORDED_LAUNCHES)


@pytest.fixture
def run(monkeypatch, tmp_path):
    NvtxProfiler.made = []
    monkeypatch.setattr(_session, "Profiler", NvtxProfiler)
    lib = tmp_path / "libcupti.so.13"
    lib.write_bytes(b"")
    monkeypatch.setattr(_nvtx, "_cupti_path", lambda: str(lib))
    monkeypatch.delenv(_nvtx.INJECTION_VAR, raising=False)
    monkeypatch.delitem(sys.modules, "nvtx.nvtx", raising=False)  # as in a fresh process: no NVTX call made yet
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SEEN))

    def go(*flags):
        code = cli.main(["run", "--no-report", *flags, str(script)])
        seen = json.loads((tmp_path / "seen.json").read_text()) if (tmp_path / "seen.json").exists() else "not run"
        return code, seen, (NvtxProfiler.made[-1].options if NvtxProfiler.made else None)

    go.lib = str(lib)
    return go


def test_nvtx_routes_nvtx_before_the_script_and_takes_every_range(run):
    code, seen, options = run("--nvtx", "--mode", "user")
    assert code == 0 and seen == run.lib and NvtxProfiler.made[-1].env_at_start == run.lib
    assert options == {"mode": "user", "nvtx": True}
    assert _nvtx.INJECTION_VAR not in os.environ  # as before the run


def test_include_and_exclude_patterns_reach_the_profiler_and_imply_nvtx(run):
    code, seen, options = run("--nvtx-include", "step", "--nvtx-include", "NVTX@*/forward, seq = 3",
                              "--nvtx-exclude", "*/backward")
    assert code == 0 and seen == run.lib
    assert options == {"mode": "auto", "nvtx": ["step", "NVTX@*/forward, seq = 3"], "nvtx_exclude": ["*/backward"]}


def test_without_nvtx_nothing_is_routed(run):
    code, seen, options = run()
    assert code == 0 and seen is None and options == {"mode": "auto", "first_start_beside": True}  # no NVTX filter


def test_a_variable_set_before_is_left_as_it_was(run, monkeypatch):
    monkeypatch.setenv(_nvtx.INJECTION_VAR, run.lib)
    code, seen, _ = run("--nvtx")
    assert code == 0 and seen == run.lib and os.environ[_nvtx.INJECTION_VAR] == run.lib


@pytest.mark.parametrize("flags, needle", [
    (["--nvtx-include", "step//fwd"], "--nvtx-include: 'step//fwd' has an empty level"),
    (["--nvtx-exclude", "@x"], "--nvtx-exclude: '@x' has no domain"),
    (["--nvtx", "--sample", "pm-default@100us"], "PM sampling (--sample) records gpuscope.range blocks"),
])
def test_bad_nvtx_options_are_refused_before_the_script_starts(run, capsys, flags, needle):
    code, seen, _ = run(*flags)
    assert code == 4 and seen == "not run" and needle in capsys.readouterr().err
    assert _nvtx.INJECTION_VAR not in os.environ


def test_another_tools_injection_is_refused_before_the_script_starts(run, monkeypatch, tmp_path, capsys):
    other = tmp_path / "libToolsInjection64.so"
    other.write_bytes(b"")
    monkeypatch.setenv(_nvtx.INJECTION_VAR, str(other))
    code, seen, _ = run("--nvtx")
    assert code == 4 and seen == "not run" and "another NVTX tool" in capsys.readouterr().err
    assert os.environ[_nvtx.INJECTION_VAR] == str(other)


def test_a_profiler_without_nvtx_support_is_a_clear_message(run, monkeypatch, capsys):
    class Older(NvtxProfiler):
        def __init__(self, metrics, device=0, *, mode="user"):
            super().__init__(metrics, device, mode=mode)

    monkeypatch.setattr(_session, "Profiler", Older)
    code, seen, _ = run("--nvtx")
    assert code == 4 and seen == "not run" and "does not support --nvtx" in capsys.readouterr().err
    assert _nvtx.INJECTION_VAR not in os.environ
