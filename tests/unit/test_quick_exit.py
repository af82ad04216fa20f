"""The exit after `gpuscope run` (gpuscope._commands.exits.quick_exit), in child processes: the script's atexit
handlers run and its open files are flushed, gpuscope's release of what it keeps does not run, the status passes
through; with a live non-daemon thread or GPUSCOPE_QUICK_EXIT=0 the exit is Python's own."""

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = """
import atexit, sys, threading, time, weakref
from gpuscope._gpu import keep
from gpuscope._commands.exits import quick_exit

class Listener:  # what keep's atexit handler closes: it says so if it runs
    def close(self):
        print("keep released", flush=True)

keep._listeners[0] = Listener()
class Gone:
    pass
gone = Gone()
dead = weakref.proxy(gone)  # a proxy whose object is gone: isinstance() on it raises ReferenceError
del gone
f = open(sys.argv[1], "w")
f.write("written, never closed")
atexit.register(lambda: print("the script's atexit ran", flush=True))
if sys.argv[2] == "thread":
    threading.Thread(target=time.sleep, args=(0.5,)).start()
quick_exit(3)
print("python's own exit", flush=True)
sys.exit(5)
"""


def _child(tmp_path, mode, env=None):
    out = tmp_path / "out.txt"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(out), mode], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
    return done, out.read_text()


def test_quick_exit_runs_the_scripts_handlers_flushes_files_and_skips_gpuscopes_release(tmp_path):
    done, text = _child(tmp_path, "plain")
    assert done.returncode == 3, done.stderr
    assert "the script's atexit ran" in done.stdout and "keep released" not in done.stdout
    assert "python's own exit" not in done.stdout
    assert text == "written, never closed"


@pytest.mark.parametrize("mode, env", [("thread", {}), ("plain", {"GPUSCOPE_QUICK_EXIT": "0"})])
def test_otherwise_python_exits_as_usual(tmp_path, mode, env):
    done, text = _child(tmp_path, mode, env)
    assert done.returncode == 5, done.stderr
    assert "python's own exit" in done.stdout and "keep released" in done.stdout
    assert text == "written, never closed"


def test_the_program_entry_is_main_then_the_exit():
    from gpuscope import cli

    assert cli.entry.__doc__ and "quick_exit" in cli.entry.__doc__
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["gpuscope"] == "gpuscope.cli:entry"
