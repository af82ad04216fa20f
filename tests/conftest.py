"""The unit suite runs in parallel: one pytest-xdist worker per CPU, each test file whole on one worker.

Where pytest-xdist is installed (the ``test`` extra), a run that gives no ``-n`` and selects no GPU tests gets
``-n auto --dist loadfile``; ``-n 0`` runs in this process. Workers, and pytest runs that a test on a worker
starts, never start workers of their own. GPU tests (``-m gpu``) always run one at a time: they
share one GPU's counters. This is a hook rather than ``addopts`` so that a machine without pytest-xdist (the GPU
machine's environment) runs the same commands.
"""

from __future__ import annotations

import os

import pytest


def selects_gpu_tests(markexpr: str) -> bool:
    """Whether a ``-m`` expression can select tests marked ``gpu`` (``gpu``, ``gpu or slow``; not ``not gpu``)."""
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return any(word == "gpu" and (i == 0 or words[i - 1] != "not") for i, word in enumerate(words))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns -n into workers
def pytest_cmdline_main(config):
    if hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker, or a pytest that a test of a worker runs: never workers of workers
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("numprocesses", None) is not None:
        return
    if selects_gpu_tests(config.getoption("markexpr", "") or "") or config.getoption("usepdb", False):
        return
    config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "loadfile"


@pytest.fixture(autouse=True)
def _ctrl_c_is_keyboard_interrupt():
    """Every test meets Ctrl-C as a terminal's user does: SIGINT raises KeyboardInterrupt in the main thread, whatever
    the suite was started from. A job started in the background (``cmd &``, ``nohup``, some CI runners) inherits
    SIGINT ignored, and Python then leaves it ignored: the four tests that send Ctrl-C (test_faults,
    test_keep_workers) failed so, serially and on xdist workers alike."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
