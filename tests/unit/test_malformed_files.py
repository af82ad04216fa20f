"""Damaged or edited gpuscope files: open_dataset and `gpuscope show`/`compare` say what is wrong in one line and
exit with the "bad file" status (5), never a traceback; PM samples without a sample are shown, not refused."""

import re
from pathlib import Path

import h5py
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._schema import dataset as _dataset
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


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """PM samples as save_dataset writes them: span_path (in the group of the span table) as int32 codes into its
    gpuscope_strings table."""
    path = tmp_path_factory.mktemp("files") / "samples.nc"
    gs.save_dataset(gs.open_dataset(DATA / "demo_timeseries.nc"), path)
    with h5py.File(path) as f:
        assert f["spans/span_path"].dtype == "int32" and f["spans/span_path"].attrs["gpuscope_strings"] == \
            '["stream", "fma", "divergent"]'
    return path


def coded(src: Path, dst: Path, codes=None, table=None, dtype=None) -> Path:
    dst.write_bytes(src.read_bytes())
    with h5py.File(dst, "a") as f:
        group = f["spans"]
        var = group["span_path"]
        if dtype is not None:  # the same values in another type: a new variable on the same dim
            values, attrs = var[...], dict(var.attrs)
            del group["span_path"]
            var = group.create_dataset("span_path", data=values.astype(dtype))
            var.dims[0].attach_scale(group["span"])
            var.attrs["gpuscope_strings"] = attrs["gpuscope_strings"]
        if codes is not None:
            var[...] = codes
        if table is not None:
            var.attrs["gpuscope_strings"] = table
    return dst


def assert_one_line_exit_5(capsys, path, start):
    code, out, err = show(capsys, "show", str(path))
    assert code == cli.EXIT_FILE, err
    assert err.startswith(f"gpuscope show: error: {path}: {start}") and err.rstrip().endswith(
        "the file was edited or damaged. Save the Dataset again with gpuscope.save_dataset.")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.parametrize("edit, says", [
    ({"codes": [-1, -1, -1]}, "'span_path' holds the code -1, and its gpuscope_strings has 3 strings (codes 0 to 2)"),
    ({"codes": [0, 1, 7]}, "'span_path' holds the code 7, and its gpuscope_strings has 3 strings (codes 0 to 2)"),
    ({"table": '{"a": "b"}'}, "the gpuscope_strings attribute of 'span_path' ('{\"a\": \"b\"}') is not a JSON list"),
    ({"table": "[1, 2, 3]"}, "the gpuscope_strings attribute of 'span_path' ('[1, 2, 3]') is not a JSON list of"),
    ({"table": "[oops"}, "the gpuscope_strings attribute of 'span_path' ('[oops') is not a JSON list of strings"),
    ({"table": 5}, "the gpuscope_strings attribute of 'span_path' ('5') is not a JSON list of strings"),
    ({"dtype": "float64"}, "'span_path' holds float64 values, not integer codes into its gpuscope_strings"),
])
def test_string_codes_that_save_dataset_does_not_write_are_a_bad_file(tmp_path, samples, capsys, edit, says):
    """Negative codes used to index from the end of the table (every span became 'divergent', `gpuscope show`
    exited 0); a code out of range, a table that is a JSON object or not text gave a traceback and exit 1."""
    path = coded(samples, tmp_path / "bad.nc", **edit)
    with pytest.raises(NotGpuscopeDataError) as refused:
        gs.open_dataset(path)
    assert str(refused.value).startswith(f"{path}: {says}")
    assert_one_line_exit_5(capsys, path, says)


@pytest.mark.parametrize("attr, value, tag, says", [
    ("overflows", 0, "json", "attr 'overflows' of the Dataset cannot be read as json (it holds 0, not JSON text)"),
    ("chip", "GH100", "bool", "attr 'chip' of the Dataset cannot be read as bool (it holds 'GH100', where bools"),
    ("overflows", 2, "bool", "attr 'overflows' of the Dataset cannot be read as bool (it holds 2, where bools are"),
    ("overflows", 0, "none", "attr 'overflows' of the Dataset cannot be read as none (it holds 0, where None is"),
])
def test_an_attr_whose_type_tag_does_not_fit_its_value_is_a_bad_file(tmp_path, samples, capsys, attr, value, tag,
                                                                     says):
    """A json tag on a number was a TypeError traceback (exit 1); a bool tag on text read as True."""
    path = edited(samples, tmp_path / "bad.nc", **{attr: value},
                  gpuscope_attr_types=f'{{"": {{"metrics": "list", "{attr}": "{tag}"}}}}')
    with pytest.raises(NotGpuscopeDataError, match=re.escape(says)):
        gs.open_dataset(path)
    assert_one_line_exit_5(capsys, path, says)


def test_tables_of_an_older_schema_that_do_not_fit_are_a_bad_file(tmp_path, capsys):
    """Schema 2 kept the span table in list attrs; columns of different lengths were a bare ValueError from
    gs.open_dataset."""
    ts = gs.open_dataset(DATA / "demo_timeseries.nc")
    old = ts.rename_vars({"span_index": "span"})
    old.attrs.update(gpuscope_schema=2, span_path=["a", "b"], span_thread=[1, 2, 3], span_start_ns=[1, 2, 3],
                     span_end_ns=[4, 5])
    path = tmp_path / "schema2.nc"
    with pytest.MonkeyPatch.context() as m:  # as schema 2 wrote them: list attrs, no groups
        m.setattr(_dataset, "table_groups", lambda ds: (ds, {}))
        gs.save_dataset(old, path)
    says = ("it cannot be converted from gpuscope schema 2 (ValueError: the columns of the span table differ in "
            "length (span_path 2, span_thread 3, span_start_ns 3, span_end_ns 2))")
    with pytest.raises(NotGpuscopeDataError, match=re.escape(says)):
        gs.open_dataset(path)
    assert_one_line_exit_5(capsys, path, says)
