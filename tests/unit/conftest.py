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
