"""Smaller faults of issue 52 (item 12): a GPUSCOPE_SHM_DIR that is not a usable folder, and a description cache
whose values are not descriptions, each answered with what to do instead of a raw error or a traceback."""

import json
import threading

import pytest

from gpuscope._gpu import catalog as _catalog
from gpuscope._pm_sampling import shm as _shm


@pytest.mark.parametrize("name, error, says", [
    ("missing", FileNotFoundError, "which does not exist: create it, name another folder"),
    ("file", NotADirectoryError, "which is not a folder: name a folder"),
])
def test_a_shm_dir_that_is_not_a_folder_is_named_with_what_to_do(tmp_path, monkeypatch, name, error, says):
    (tmp_path / "file").write_text("")
    folder = tmp_path / name
    monkeypatch.setenv(_shm.ENV_VAR, str(folder))
    with pytest.raises(error) as caught:
        _shm.reserve_images(1, 4096)
    assert str(caught.value) == (f"GPUSCOPE_SHM_DIR names {str(folder)!r}, {says}, or unset GPUSCOPE_SHM_DIR to keep "
                                 "the images in anonymous shared memory")
    monkeypatch.setenv(_shm.ENV_VAR, str(tmp_path))  # a folder: images made there
    images, note = _shm.reserve_images(1, 4096)
    assert len(images) == 1 and note == ""
    _shm.close_images(images)


class Properties:
    def __init__(self, name):
        self.description = f"what {name} counts"


class StandIn:
    """A chip's metrics as the catalog keeps them, with CUPTI's description calls counted."""
    chip, kind = "GH100", _catalog.MetricKind.SAMPLING
    types = {"a__cycles": "COUNTER", "b__ratio": "RATIO"}

    def __init__(self):
        self._lock = threading.Lock()
        self.asked = []
        self.host = self

    def metric_properties(self, name):
        self.asked.append(name)
        return Properties(name)


@pytest.mark.parametrize("kept", [{"a__cycles": 3, "b__ratio": None}, {"a__cycles": ["x"], "b__ratio": "y"}])
def test_a_description_cache_of_other_value_types_is_read_again(tmp_path, monkeypatch, capsys, kept):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stand_in = StandIn()
    monkeypatch.setattr(_catalog, "_chip_metrics", lambda chip, kind: stand_in)
    monkeypatch.setattr(_catalog, "resolve_chip", lambda chip: chip)
    monkeypatch.setattr("gpuscope.cupti._api.version", lambda: (13, 0))
    path = tmp_path / "gpuscope" / "descriptions-GH100-sampling-cupti13.0.json"
    path.parent.mkdir()
    path.write_text(json.dumps(kept))  # the right metrics, but not one description (str) each
    table = _catalog.descriptions("GH100", "sampling")
    assert table == {"a__cycles": "what a__cycles.sum counts", "b__ratio": "what b__ratio.ratio counts"}
    assert stand_in.asked == ["a__cycles.sum", "b__ratio.ratio"] and json.loads(path.read_text()) == table
    assert "reading 2 metric descriptions from CUPTI once" in capsys.readouterr().err
