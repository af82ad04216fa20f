"""GPU tests: every test here is marked ``gpu`` and skipped where no NVIDIA driver and GPU are present.

Run them on a GPU machine with ``python3 -m pytest -m gpu tests/gpu``. Without a GPU they are not collected.
"""

import os
import random

import pytest


def _gpu_present() -> bool:
    try:
        from gpuscope._gpu import device as _device

        return _device.device_count() > 0
    except Exception:
        return False


# Without a GPU the modules here are not even imported: they compile kernels at import time, and importing
# numba.cuda for real would stop the unit tests from using Numba's CUDA simulator later in the same run.
if not _gpu_present():
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    present = None
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if present is None:
                present = _gpu_present()
            if not present:
                item.add_marker(pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine"))
    # GPUSCOPE_TEST_SHUFFLE=<seed> runs the GPU tests in a random order (benchmarks/device_check.sh does): no test
    # may depend on what ran before it in the process. PC-sampling tests use kernels that CUPTI first sees inside
    # their pc_sample block (tests/gpu/test_pc_sampling.py says why).
    seed = os.environ.get("GPUSCOPE_TEST_SHUFFLE")
    if seed:
        random.Random(int(seed)).shuffle(items)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"GPU tests shuffled with seed {seed}")


@pytest.fixture(autouse=True)
def _kernel_names_of_a_fresh_process(monkeypatch):
    """Each test names kernels as a fresh process does: gpuscope names them with one table per process, so a kernel
    of another module with the same name, profiled by an earlier test, would lengthen this test's names."""
    from gpuscope._schema import names

    monkeypatch.setattr(names, "_process_names", names.KernelNames())


@pytest.fixture(autouse=True)
def _give_the_counters_back():
    """After each test, release the range profiler gpuscope keeps between sessions: the counters are the GPU's,
    and tests that start other processes (or query availability) need them free."""
    yield
    from gpuscope._gpu import keep as _keep

    _keep.release()
