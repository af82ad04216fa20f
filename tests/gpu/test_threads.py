"""Never block the program: many threads launching and loading modules at once under each mode finish within a
deadline (in a subprocess, so that a hang fails the test instead of hanging the suite)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "threads_stress.py"
DEADLINE_S = 120


@pytest.mark.parametrize("mode", ["kernel", "auto", "iteration", "user"])
def test_threads_launching_and_loading_modules_finish(mode):
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), mode, "8", "20"], capture_output=True, text=True,
                              timeout=DEADLINE_S, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{mode} mode: the threads did not finish within {DEADLINE_S} s (a hang)\n{exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["results_ok"], result  # the program's own results, profiled or not
    if mode in ("kernel", "user"):  # iteration passes that other threads' launches made differ may keep none
        assert result["rows"] > 0, result
