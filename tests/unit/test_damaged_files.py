"""Damaged files cannot hang, flood or crash the reader (gpuscope/_results/untrusted.py): a seeded corruption fuzz of
the shipped recordings through ``gpuscope show``, and the damage each of its kinds stands for (a spin inside HDF5, a
declared size beyond the file, a FIFO, a socket, a file that is not HDF5), each refused with one line."""

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._results import untrusted
from gpuscope.cupti import _images, _python, pm_sampling
from gpuscope.errors import CounterDataImageError, NotGpuscopeDataError

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(gs.__file__).parent / "data"
LAUNCHES = DATA / "demo_launches.nc"
#: The recordings the fuzz damages: range results and PM samples as gpuscope ships them, a Speed-of-Light file of
#: the H100 and a PM file with span and execution tables.
SHIPPED = [LAUNCHES, DATA / "demo_timeseries.nc", ROOT / "tests/fixtures/sol/sol_occupancy_gh100.nc",
           ROOT / "tests/fixtures/phases/idle_gaps.nc"]
CASES = 6  # per recording: 24 damaged files, about a second each (the check's child process)
#: Deadline of the check in these tests: a spin costs this, and a sound file takes well under a second.
DEADLINE_S = 15.0


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setattr(untrusted, "BASE_DEADLINE_S", DEADLINE_S)
    monkeypatch.setattr(untrusted, "_checked", untrusted.collections.OrderedDict())


def damaged(rng: random.Random, data: bytes) -> bytes:
    """*data* with one kind of damage: bytes overwritten at random, a run of zeros, or the end cut off."""
    out = bytearray(data)
    how = rng.choice(["bytes", "zeros", "cut"])
    if how == "cut":
        return bytes(out[:rng.randrange(len(out))])
    if how == "zeros":
        start = rng.randrange(len(out))
        end = min(len(out), start + rng.randint(1, 64))
        out[start:end] = bytes(end - start)
        return bytes(out)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def show(capsys, path):
    code = cli.main(["show", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("recording", SHIPPED, ids=lambda p: p.name)
def test_damaged_recordings_are_shown_or_refused_in_one_line(tmp_path, capsys, recording):
    rng = random.Random(f"issue 52 {recording.name}")  # seeded: the same damage every run
    data = recording.read_bytes()
    refused = 0
    for case in range(CASES):
        path = tmp_path / f"{case}.nc"
        path.write_bytes(damaged(rng, data))
        code, out, err = show(capsys, path)
        assert code in (cli.EXIT_OK, cli.EXIT_FILE), (case, code, err)
        assert "Traceback" not in err and "Exception ignored" not in err, (case, err)
        if code == cli.EXIT_FILE:
            refused += 1
            assert err.startswith(f"gpuscope show: error: {path}") and len(err.strip().splitlines()) == 1, err
        else:
            assert out.startswith("gpuscope report") and err == "", err
    assert refused  # the fuzz reached damage that matters


def edited(tmp_path, offset: int, new: bytes) -> Path:
    data = bytearray(LAUNCHES.read_bytes())
    data[offset:offset + len(new)] = new
    path = tmp_path / "edited.nc"
    path.write_bytes(bytes(data))
    return path


def test_a_file_that_makes_hdf5_spin_is_stopped_at_the_deadline(tmp_path, capsys):
    path = edited(tmp_path, 53012, b"\x00")  # one byte of a B-tree node: HDF5 loops on it at 100% CPU, for ever
    with pytest.raises(NotGpuscopeDataError, match=rf"reading it did not finish in {DEADLINE_S:.0f} s \(in a child "
                                                   r"process, which was stopped\); the file is damaged"):
        gs.open_dataset(path)


def test_a_string_length_beyond_the_file_is_refused_before_it_is_allocated(tmp_path):
    path = edited(tmp_path, 46930, (0x7F000000).to_bytes(4, "little"))  # the first kernel name: 2 GB long
    with pytest.raises(NotGpuscopeDataError, match=r"'kernel' declares variable-length values of 2130706516 bytes "
                                                   r"in all \(one of 2130706432\), more than the file of 108244 "
                                                   "bytes can hold"):
        gs.open_dataset(path)


def test_what_the_size_check_does_not_see_the_memory_limit_stops(tmp_path, monkeypatch):
    path = edited(tmp_path, 46930, (0x7F000000).to_bytes(4, "little"))
    monkeypatch.setattr(untrusted, "_CHILD", untrusted._CHILD.replace("if vlen and not filtered", "if False"))
    with pytest.raises(NotGpuscopeDataError, match="HDF5 cannot read it safely: .*memory allocation failed"):
        gs.open_dataset(path)


def test_a_dataset_that_stores_nothing_may_not_declare_more_than_the_limit(tmp_path):
    path = tmp_path / "unstored.nc"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(untrusted.UNSTORED_LIMIT // 8 + 1,), dtype="f8")  # never written: fill values
    with pytest.raises(NotGpuscopeDataError, match=r"'x' declares 8388609 values of float64 \(67108872 bytes\) "
                                                   "and stores none"):
        gs.open_dataset(path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "results.nc"
    os.mkfifo(fifo)
    code, out, err = show(capsys, fifo)
    assert code == cli.EXIT_FILE and out == ""
    assert err.strip() == (f"gpuscope show: error: {fifo}: it is a FIFO (named pipe), not a file; gpuscope reads "
                           "saved results only from regular files (copy the data to a file first). gpuscope writes "
                           "its results with gpuscope run -o FILE.nc or gpuscope.save_dataset.")


def test_a_socket_and_a_file_that_is_not_hdf5_are_refused(tmp_path):
    with socket.socket(socket.AF_UNIX) as listening:  # a node that is not a file, made without root (as a device)
        listening.bind(str(tmp_path / "socket.nc"))
        with pytest.raises(NotGpuscopeDataError, match="socket.nc: it is a socket, not a file"):
            gs.open_dataset(tmp_path / "socket.nc")
    text = tmp_path / "notes.nc"
    text.write_text("not a netCDF file\n")
    with pytest.raises(NotGpuscopeDataError, match=r"it is not a netCDF-4 \(HDF5\) file \(18 bytes, no HDF5 "
                                                   r"signature\)"):
        gs.open_dataset(text)


def test_netcdf_structure_that_xarray_cannot_read_is_a_bad_file(tmp_path):
    path = tmp_path / "dims.nc"
    with h5py.File(path, "w") as f:  # a sound HDF5 file whose netCDF dimension list points nowhere
        f["x"] = np.arange(3.0)
        f["x"].attrs["DIMENSION_LIST"] = "nowhere"
    with pytest.raises(NotGpuscopeDataError, match=r"dims.nc: netCDF cannot read it \("):
        gs.open_dataset(path)


def test_a_sound_file_is_checked_once_and_read_from_the_checked_bytes(monkeypatch, tmp_path):
    runs = []
    real = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    first = gs.open_dataset(LAUNCHES)
    copy = tmp_path / "copy.nc"
    copy.write_bytes(LAUNCHES.read_bytes())
    second = gs.open_dataset(copy)  # the same bytes elsewhere: the verdict holds
    assert len(runs) == 1 and first.identical(second)


HANGS = "#!/bin/sh\nexec sleep 600\n"  # exec: the process killed at the deadline is the one that sleeps


def test_a_hanging_gpuscope_python_is_not_blamed_on_the_file_or_the_image(tmp_path, monkeypatch, capsys):
    hangs = tmp_path / "python"
    hangs.write_text(HANGS)
    hangs.chmod(0o755)
    monkeypatch.setenv(_python.ENV_VAR, str(hangs))
    monkeypatch.setattr(untrusted, "BASE_DEADLINE_S", 2.0)
    with pytest.raises(ChildProcessError, match=rf"did not start within 2 s \(is {hangs} a working Python\? "
                                                 "GPUSCOPE_PYTHON"):
        gs.open_dataset(LAUNCHES)
    code = cli.main(["show", str(LAUNCHES)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FILE and "did not start within 2 s" in err and "is not a netCDF file" not in err
    monkeypatch.setattr(_images, "CHECK_TIMEOUT_S", 2.0)
    monkeypatch.setattr(_images, "_verdicts", {})
    image = np.load(ROOT / "tests/fixtures/pm/gh100_pm_default_counter_data.npz")["image"]
    with pytest.raises(CounterDataImageError, match=r"could not be checked before CUPTI reads it: the child process "
                                                    r"that checks it did not get ready in 2 s .*The pm_sampling "
                                                    r"counter-data image was not judged"):
        pm_sampling.counter_data_info(image.copy())


def test_negative_durations_are_left_out_of_times_and_shares():
    launches = gs.open_dataset(LAUNCHES)
    launches["gpu__time_duration.sum"][0] = -3e9  # an edited file: one launch 3 s long, negative
    table = gs.report(launches)
    shares = table.reset_index()["share"].to_numpy()
    assert ((shares >= 0) & (shares <= 100)).all() and np.isclose(shares.sum(), 100)
    assert "negative gpu__time_duration.sum in 1 of 15 launches (impossible: the data was edited or damaged): left " \
           "out of times and shares." in " ".join(str(table).split())
    samples = gs.open_dataset(DATA / "demo_timeseries.nc")
    samples["end_ns"].values[5] = samples["start_ns"].values[5] - 10**12
    table = gs.report(samples)
    shares = table.reset_index()["share"].to_numpy()
    assert ((shares >= 0) & (shares <= 100)).all() and np.isclose(shares.sum(), 100)
    assert "negative end_ns - start_ns in 1 of 18019 samples" in " ".join(str(table).split())
