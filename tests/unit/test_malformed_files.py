"""Damaged or edited gpuscope files: open_dataset and `gpuscope show`/`compare` say what is wrong in one line and
exit with the "bad file" status (5), never a traceback; PM samples without a sample are shown, not refused."""

from pathlib import Path

import h5py
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope.errors import NotGpuscopeDataError

DATA = Path(gs.__file__).parent / "data"


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    path = tmp_path_factory.mktemp("files") / "launches.nc"
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    ds.attrs["options"] = {"interval": "20us"}  # a json-tagged attr
    gs.save_dataset(ds, path)
    return path


def edited(src: Path, dst: Path, **attrs) -> Path:
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "a") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
    return dst


def show(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("types", ["[1,2]", '{"": "x"}', "{oops", '{"": {"mode": "weird"}}', "3"])
def test_a_malformed_attr_type_record_is_a_bad_file(tmp_path, launches, capsys, types):
    path = edited(launches, tmp_path / "bad.nc", gpuscope_attr_types=types)
    with pytest.raises(NotGpuscopeDataError, match="gpuscope_attr_types attribute .* is not what gpuscope writes"):
        gs.open_dataset(path)
    for argv in (["show", str(path)], ["compare", str(path), str(launches)]):
        code, out, err = show(capsys, *argv)
        assert code == cli.EXIT_FILE, err
        assert err.startswith(f"gpuscope {argv[0]}: error: {path}: its gpuscope_attr_types attribute")
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and out == ""


def test_an_attr_that_does_not_decode_as_its_type_says(tmp_path, launches, capsys):
    path = edited(launches, tmp_path / "bad.nc", options="{not json")
    with pytest.raises(NotGpuscopeDataError, match="attr 'options' of the Dataset cannot be read as json"):
        gs.open_dataset(path)
    code, _, err = show(capsys, "show", str(path))
    assert code == cli.EXIT_FILE and "cannot be read as json" in err


def test_a_kind_that_does_not_match_the_dims_is_a_bad_file(tmp_path, launches, capsys):
    path = edited(launches, tmp_path / "bad.nc", kind="pm_sampling")  # range results that say they are PM samples
    for argv in (["show", str(path)], ["compare", str(path), str(launches)]):
        code, out, err = show(capsys, *argv)
        assert code == cli.EXIT_FILE, err
        assert err.strip() == (f"gpuscope {argv[0]}: error: {path}: its kind attribute says 'pm_sampling', but it "
                               "has no 'time' dim (its dims: range): the file was edited or damaged. Save the "
                               "Dataset again with gpuscope.save_dataset.")


def test_pm_samples_without_a_sample_are_shown(tmp_path, capsys):
    ts = gs.open_dataset(DATA / "demo_timeseries.nc")
    path = tmp_path / "all_lost.nc"
    gs.save_dataset(ts.isel(time=slice(0, 0)), path)  # what a run whose samples were all lost writes
    code, out, err = show(capsys, "show", str(path))
    assert code == cli.EXIT_OK and err == ""
    assert out.startswith("gpuscope report: PM sampling, no samples (NVIDIA H100 80GB HBM3, chip GH100")
    assert f"{path} holds no samples: 73 samples were lost during collection" in out
