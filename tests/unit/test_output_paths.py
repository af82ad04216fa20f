"""Every output path written one way (issue 52, items 1-4 and 9): a full disk costs the file and says so, never the
process or the report; paths resolved before the script runs; a name taken during the run is not overwritten; a
script that closes stdout still gets its results saved; no link followed, nothing but a regular file replaced."""

import io
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import xarray as xr

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._commands import run as _run
from gpuscope._range_profiling import session as _session
from gpuscope._util import outputs

from .test_run_results_worker import Recorded

HERE = Path(__file__).parent
LAUNCHES = _demo.RECORDED_LAUNCHES

#: Runs the code it is given with writes limited to a few KiB (RLIMIT_FSIZE, SIGXFSZ ignored: a write past the limit
#: fails with EFBIG, as one on a full disk fails with ENOSPC); HDF5 writing there used to end in SIGSEGV.
LIMITED = """
import resource, signal, sys
sys.path.insert(0, {here!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
"""


def _limited(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """*body* run under :data:`LIMITED` in *tmp_path*. Neither it nor the results process it starts writes bytecode:
    a .pyc cut short at the limit would break every later import of that module from this checkout."""
    code = textwrap.dedent(LIMITED.format(here=str(HERE))) + textwrap.dedent(body)
    python = tmp_path.parent / f"{tmp_path.name}-python"  # the results process's interpreter: python -B
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -B \"$@\"\n")
    python.chmod(0o755)
    env = {**os.environ, "GPUSCOPE_PYTHON": str(python), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)


class Saved:
    """A finished session whose Dataset is the demo's H100 recording (made in the run's process)."""

    def __init__(self, metrics, device=0, **options):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def dataset(self):
        return gs.open_dataset(LAUNCHES)


@pytest.fixture
def saved(monkeypatch):
    monkeypatch.setattr(_session, "Profiler", Saved)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "work.py"
    path.write_text(textwrap.dedent(body))
    return path


# ---------------------------------------------------------------------------------------------------------
# 1. A full disk
# ---------------------------------------------------------------------------------------------------------


def test_a_save_on_a_full_disk_raises_and_the_process_goes_on(tmp_path):
    """It died with SIGSEGV inside HDF5, even with the error caught."""
    done = _limited(f"""
        import gpuscope as gs
        ds = gs.open_dataset({str(LAUNCHES)!r})
        try:
            gs.save_dataset(ds, "out.nc")
        except OSError as exc:
            print("CAUGHT", exc.errno, exc.filename)
        print("ALIVE")
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["CAUGHT", "27", "out.nc", "ALIVE"]
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file


def test_a_run_on_a_full_disk_prints_the_report_and_says_what_was_not_saved(tmp_path):
    """Both the results process and the run's own retry died with SIGSEGV (exit 139): no report, no file."""
    script = _script(tmp_path, "print('script says hi')\n")
    done = _limited(f"""
        from gpuscope._range_profiling import session as _session
        from test_run_results_worker import Recorded
        _session.Profiler = Recorded
        from gpuscope import cli
        sys.exit(cli.main(["run", "-o", "out.nc", "--trace", "small.json", {str(script)!r}]))
    """, tmp_path)
    assert done.returncode == cli.EXIT_FILE, done.stderr[-2000:]
    assert "script says hi" in done.stdout and "gpuscope report" in done.stdout and "stream" in done.stdout
    assert f"{tmp_path / 'out.nc'} (-o) was not written: File too large" in done.stderr
    assert "the report above is what was collected" in done.stderr
    assert f"wrote {tmp_path / 'small.json'}" in done.stderr  # the trace is small: written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.json", "work.py"]


def test_a_csv_on_a_full_disk_leaves_the_file_that_was_there(tmp_path, capsys, monkeypatch):
    import pandas as pd

    old = tmp_path / "table.csv"
    old.write_text("an earlier table\n")

    def half_then_full(self, path, **kwargs):  # a disk that fills up half-way
        Path(path).write_text("kernel,gpu_ti")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", half_then_full)
    assert cli.main(["show", str(LAUNCHES), "--csv", str(old), "-f"]) == cli.EXIT_FILE
    assert f"cannot use {old}: No space left on device" in capsys.readouterr().err
    assert old.read_text() == "an earlier table\n" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_the_demo_writes_what_it_can_and_says_what_it_could_not(tmp_path):
    out = io.StringIO()
    (tmp_path / "launches.nc").symlink_to(tmp_path / "elsewhere.nc")
    result = _demo.analyse(gs.open_dataset(LAUNCHES), gs.open_dataset(_demo.RECORDED_SERIES), tmp_path,
                           recorded=True, out=out, width=100)
    assert result["not_written"] == [f"{tmp_path / 'launches.nc'}: it is a symbolic link (to "
                                     f"{tmp_path / 'elsewhere.nc'}): gpuscope writes no file through a link; give "
                                     "the path it points to, or remove the link"]
    assert not (tmp_path / "elsewhere.nc").exists()
    assert {"topdown.png", "timeline.png", "timeseries.nc"} <= {p.name for p in tmp_path.iterdir()}
    text = " ".join(out.getvalue().split())
    assert "not written:" in text and "Top-Down per kernel" in text


# ---------------------------------------------------------------------------------------------------------
# 2. Paths resolved before the script runs
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profiler", [Saved, Recorded], ids=["in the run", "in the results process"])
def test_outputs_go_where_the_run_started_whatever_folder_the_script_ends_in(tmp_path, monkeypatch, capsys, profiler):
    """Made in the run's process, they went to the script's final folder, over a file there without -f."""
    monkeypatch.setattr(_session, "Profiler", profiler)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "out.nc").write_text("not yours")
    script = _script(tmp_path, f"import os\nos.chdir({str(elsewhere)!r})\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "-o", "out.nc", "--trace", "out.json", str(script)]) == 0
    assert (elsewhere / "out.nc").read_text() == "not yours" and sorted(os.listdir(elsewhere)) == ["out.nc"]
    assert gs.open_dataset(tmp_path / "out.nc").sizes["range"] == (6 if profiler is Recorded else 15)
    assert (tmp_path / "out.json").stat().st_size > 0
    assert f"saved {tmp_path / 'out.nc'}" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# 3. A name taken while the run ran
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["-o", "--trace"])
def test_a_file_made_during_the_run_is_not_overwritten_without_force(saved, tmp_path, capsys, flag):
    """Four runs with one -o all exited 0, and three results were lost: the check was made at the start only."""
    target = tmp_path / "out"
    script = _script(tmp_path, f"open({str(target)!r}, 'w').write('another run')\n")
    assert cli.main(["run", flag, str(target), str(script)]) == cli.EXIT_FILE
    err = capsys.readouterr().err
    assert target.read_text() == "another run" and sorted(p.name for p in tmp_path.iterdir()) == ["out", "work.py"]
    assert (f"{target} ({flag}) was not written: it was made by something else while the script ran, and "
            f"gpuscope run does not overwrite it; pass -f/--force to replace it, or give {flag} another name") in err


def test_with_force_the_file_made_during_the_run_is_replaced(saved, tmp_path):
    target = tmp_path / "out.nc"
    script = _script(tmp_path, f"open({str(target)!r}, 'w').write('another run')\n")
    assert cli.main(["run", "-f", "-o", str(target), str(script)]) == 0
    xr.testing.assert_identical(gs.open_dataset(target), gs.open_dataset(LAUNCHES))


def test_of_writers_racing_for_one_new_name_one_wins_and_the_others_are_told(tmp_path):
    path, n = tmp_path / "out.nc", 4
    all_written = threading.Barrier(n)
    won, lost = [], []

    def fill(tmp):  # every writer has passed the check and written its file before any takes the name
        Path(tmp).write_text(threading.current_thread().name)
        all_written.wait(timeout=30)

    def writer():
        try:
            outputs.write(path, fill, overwrite=False)
            won.append(threading.current_thread().name)
        except FileExistsError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=writer, name=f"writer{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1 and len(lost) == n - 1 and path.read_text() == won[0]
    assert all("made by something else" in str(exc) for exc in lost)
    assert [p.name for p in tmp_path.iterdir()] == ["out.nc"]


def test_without_hard_links_the_name_is_still_taken_exclusively(tmp_path, monkeypatch):
    def no_links(src, dst, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "out.csv"
    outputs.write(path, lambda tmp: Path(tmp).write_text("mine"), overwrite=False)
    assert path.read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["out.csv"]

    with pytest.raises(FileExistsError):
        outputs.write(tmp_path / "new.csv", lambda tmp: (tmp_path / "new.csv").write_text("theirs"), overwrite=False)
    assert (tmp_path / "new.csv").read_text() == "theirs"


# ---------------------------------------------------------------------------------------------------------
# 4. A script that closes stdout
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", ["import sys\nsys.stdout.close()\n", "import sys\nsys.stdout = None\n"])
def test_a_script_that_closes_or_drops_stdout_still_gets_its_results(saved, tmp_path, monkeypatch, body):
    """The flush before the session's close raised: the session never closed and -o was never written."""
    stdout, stderr = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    closed = []
    monkeypatch.setattr(Saved, "__exit__", lambda self, *exc: closed.append(True) and False)
    assert cli.main(["run", "-o", str(tmp_path / "out.nc"), str(_script(tmp_path, body))]) == 0
    assert closed == [True] and (tmp_path / "out.nc").is_file()
    report = stderr.getvalue() if stdout.closed else stdout.getvalue()
    assert "gpuscope report" in report
    assert ("the script closed standard output; the report follows here" in stderr.getvalue()) == stdout.closed
    assert sys.stdout is stdout  # None is not left behind for what runs after


# ---------------------------------------------------------------------------------------------------------
# 9. Links and files that are not regular files
# ---------------------------------------------------------------------------------------------------------


def test_a_dangling_link_at_the_output_is_refused_before_the_script_runs(saved, tmp_path, capsys):
    """The link was followed: another user's link in a shared folder had the file made where it pointed."""
    link, target = tmp_path / "out.nc", tmp_path / "theirs" / "planted.nc"
    target.parent.mkdir()
    link.symlink_to(target)
    script = _script(tmp_path, "open('ran', 'w').write('yes')\n")
    for extra in ([], ["-f"]):
        assert cli.main(["run", *extra, "-o", str(link), str(script)]) == cli.EXIT_FILE
        assert f"cannot use {link}: it is a symbolic link (to {target})" in capsys.readouterr().err
    assert not target.exists() and not (tmp_path / "ran").exists() and link.is_symlink()


def test_dev_null_with_force_is_refused_and_left_a_device(saved, tmp_path, capsys):
    """As root, -o /dev/null -f replaced the device node with a netCDF file."""
    script = _script(tmp_path, "pass\n")
    assert cli.main(["run", "-f", "-o", os.devnull, str(script)]) == cli.EXIT_FILE
    assert "it is a character device, not a regular file" in capsys.readouterr().err
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_node_at_an_output_path_is_never_replaced(tmp_path, kind):
    path = tmp_path / "node"
    if kind == "fifo":
        os.mkfifo(path)
    elif os.geteuid() == 0:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a stand-in for /dev/null
    else:
        pytest.skip("only root makes device nodes")
    before = os.lstat(path)
    with pytest.raises(OSError, match="not a regular file"):
        gs.save_dataset(gs.open_dataset(LAUNCHES), path)
    with pytest.raises(OSError, match="not a regular file"):
        gs.to_perfetto(gs.open_dataset(LAUNCHES), path=path)
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["node"]


def test_a_link_or_device_put_there_while_the_file_is_written_is_not_replaced(tmp_path):
    path = tmp_path / "out.json"

    def plant(tmp):
        Path(tmp).write_text("{}")
        path.symlink_to(tmp_path / "planted")

    with pytest.raises(OSError, match="symbolic link"):
        outputs.write(path, plant)
    assert path.is_symlink() and not (tmp_path / "planted").exists()


@pytest.mark.parametrize("command", ["show", "compare"])
def test_csv_asks_before_it_overwrites_and_never_follows_a_link(tmp_path, capsys, command):
    """--csv overwrote without asking and followed links."""
    files = [str(LAUNCHES)] if command == "show" else [str(LAUNCHES), str(LAUNCHES)]
    csv = tmp_path / "table.csv"
    csv.write_text("an earlier table\n")
    assert cli.main([command, *files, "--csv", str(csv)]) == cli.EXIT_FILE
    assert (f"cannot use {csv}: it exists, and gpuscope does not overwrite it: pass -f/--force to replace it, or "
            "give --csv another name") in capsys.readouterr().err
    assert csv.read_text() == "an earlier table\n"
    assert cli.main([command, *files, "--csv", str(csv), "-f"]) == 0
    assert csv.read_text().startswith("kernel") or "quantity" in csv.read_text().splitlines()[0]
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "planted.csv")
    assert cli.main([command, *files, "--csv", str(link), "-f"]) == cli.EXIT_FILE
    assert "is a symbolic link" in capsys.readouterr().err and not (tmp_path / "planted.csv").exists()


def test_a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    umask = os.umask(0o027)
    try:
        path = outputs.write_bytes(tmp_path / "a.bin", b"one", overwrite=False)
        assert os.stat(path).st_mode & 0o777 == 0o640
        os.chmod(path, 0o600)
        outputs.write_bytes(path, b"two")
        assert os.stat(path).st_mode & 0o777 == 0o600 and Path(path).read_bytes() == b"two"
    finally:
        os.umask(umask)
