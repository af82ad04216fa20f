"""Shared fixtures of the unit tests."""

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="session")
def pm_recording():
    """The PM sampling recording from the H100 (CUPTI 13.0, pm-default at 100 µs): metadata, counter-data image,
    and each sample's (start, end) as GetSampleInfo gave them."""
    pm = FIXTURES / "pm"
    meta = json.loads((pm / "gh100_pm_default.json").read_text())
    image = np.load(pm / "gh100_pm_default_counter_data.npz")["image"]
    stamps = np.load(pm / "gh100_pm_default_timestamps.npy")
    return meta, image, stamps


class ChildChecks(list):
    """What the child process that checks images was asked, one ``(kind, chip, metrics, profiler type, bytes)`` per
    child; :attr:`answer` gives its verdict (by default, that of a sound image with a count of 1)."""

    def __init__(self):
        super().__init__()
        from gpuscope.cupti import _images

        self.answer = lambda image, kind: _images.ImageInfo(kind, 1)


@pytest.fixture
def child_checks(monkeypatch):
    """The image checks' child process, replaced: no child is started, what each would have tried is recorded, and
    nothing checked before this test counts."""
    from gpuscope.cupti import _images

    asked = ChildChecks()

    def check(image, kind, chip, metrics, what, profiler_type=None):
        asked.append((kind.value, chip, tuple(metrics), profiler_type, image.size))
        return asked.answer(image, kind)

    monkeypatch.setattr(_images, "_check_in_child", check)
    monkeypatch.setattr(_images, "_verdicts", {})
    return asked


@pytest.fixture(autouse=True)
def _kernel_names_of_a_fresh_process(monkeypatch):
    """Each test names kernels as a fresh process does: gpuscope names them with one table per process
    (gpuscope._schema.names.kernel_names), so a kernel named by an earlier test would change later tests' names."""
    from gpuscope._schema import names

    monkeypatch.setattr(names, "_process_names", names.KernelNames())
