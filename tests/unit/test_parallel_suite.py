"""Issue 54: the unit suite runs in parallel under pytest-xdist (tests/conftest.py), GPU tests one at a time."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import selects_gpu_tests

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("expr, gpu", [("gpu", True), ("not gpu", False), ("gpu or slow", True),
                                       ("slow and not gpu", False), ("(gpu)", True), ("", False), ("gpus", False)])
def test_gpu_runs_are_told_apart_from_unit_runs(expr, gpu):
    assert selects_gpu_tests(expr) is gpu


def _run(*args: str) -> str:
    """pytest run as a user runs it (not as a pytest that a test on a worker starts, which runs in one process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 5), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_unit_tests_run_on_workers_and_gpu_tests_in_this_process():
    pytest.importorskip("xdist")
    assert "workers" in _run("tests/unit/test_benchmarks_layout.py")
    assert "workers" not in _run("-m", "gpu", "--co", "-q", "tests/gpu/test_foundation.py")
    assert "workers" not in _run("-n", "0", "tests/unit/test_benchmarks_layout.py")


def test_ctrl_c_tests_pass_when_the_suite_was_started_with_sigint_ignored():
    """A suite started in the background inherits SIGINT ignored; the Ctrl-C tests still meet KeyboardInterrupt."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
                           "tests/unit/test_faults.py::test_run_shielded_finishes_the_teardown_despite_two_ctrl_c"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:]
