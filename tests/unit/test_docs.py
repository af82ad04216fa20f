"""Every documented Python snippet runs on the shipped H100 recordings (those marked ``<!-- gpu -->`` need a
device and run in tests/gpu), with checks on the values they produce; the printed outputs the pages show are what
gpuscope prints; and the Sphinx guide builds without warnings."""

import itertools
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope as gs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"(<!-- gpu -->\n)?```python\n(.*?)```", re.S)


def snippets():
    for path in DOCS:
        for i, m in enumerate(BLOCK.finditer(path.read_text())):
            gpu = bool(m.group(1))
            yield pytest.param(path.name, i, m.group(2), gpu, id=f"{path.name}-{i}")


#: Checks on what a snippet leaves behind: file name, block -> function of its namespace.
def _phases(ns):
    ph = ns["ph"]
    dram = ph.phase_mean.sel(metric="dram__read_throughput.avg.pct_of_peak_sustained_elapsed")
    stream_phase = int(ph.phase.values[ph["range"].values == "stream"][100])
    assert float(dram.sel(phase_id=stream_phase)) > 30  # streaming reads DRAM at >30% of peak
    assert ph.sizes["time"] == 18019


def _phase_topdown(ns):
    time = ns["per_phase"]["time_in_phase"].to_pandas()
    stream_only = [p for p in time.index if time.loc[p, "stream"] > 0.99 * time.loc[p].sum()]
    assert stream_only  # the stream range is one phase (or several alike), with stream's Top-Down
    for p in stream_only:
        assert ns["table"].loc[p, "retire"] == pytest.approx(30.83, abs=0.5)  # stream: 30.8% of peak
    level1 = ns["table"][["retire", "divergence", "frontend", "backend"]].sum(axis=1)
    assert ((level1 - 100.0).abs() < 1.25).all()
    assert len(ns["fig"].axes) >= 2


def _topdown(ns):
    per_kernel = ns["per_kernel"]
    assert per_kernel.retire.sel(kernel="fma").item() == pytest.approx(74.79, abs=0.01)  # percent of peak
    assert per_kernel.retire.sel(kernel="stream").item() == pytest.approx(30.82, abs=0.01)
    assert per_kernel.retire.sel(kernel="divergent").item() == pytest.approx(2.56, abs=0.01)
    assert ns["one_kernel"].launch.values.tolist() == [0, 3, 6, 9, 12]


def _metrics(ns):
    assert ns["gs"] is gs


def _report(ns):
    report = ns["report"]
    assert set(report.index) == {"stream", "fma", "divergent"}
    assert report.loc["fma", "bound_by"] == "backend_core" and report.loc["stream", "bound_by"] == "backend_memory"
    assert int(report["launches"].sum()) == 15


def _compare(ns):
    assert len(ns["diff"]) > 0 and len(ns["changed"]) == 0  # a recording against itself: nothing significant


def _trace(ns):
    size = Path("demo_trace.json").stat().st_size  # the snippet writes into the (temporary) working directory
    assert size > 1e6
    trace, ph = ns["trace"], ns["ph"]
    assert [e["name"] for e in ns["kernels"]] == ["stream", "fma", "divergent"] * 5
    assert ns["kernels"][1]["args"]["topdown.retire"] == pytest.approx(74.79, abs=0.01)
    assert len([e for e in trace["traceEvents"] if e["ph"] == "C"]) == 8 * 18019
    assert len([e for e in trace["traceEvents"] if e["name"].startswith("phase ")]) == ph.sizes["segment"]


def _multi_gpu(ns):
    merged, imb, per_rank = ns["merged"], ns["imb"], ns["per_rank"]
    assert merged["rank"].values.tolist() == [0, 1] and merged["host"].values.tolist() == ["node0", "node1"]
    assert imb["slowest_rank"].values.tolist() == [1, 1, 1]  # rank 1 ran every kernel 30% longer
    assert imb["imbalance"].values == pytest.approx([1.3 / 1.15 - 1] * 3, rel=1e-9)
    assert per_rank.retire.sel(kernel="fma").values == pytest.approx([74.79, 74.79], abs=0.01)  # same counters
    assert len(ns["fig"].axes) == 2


def _sol(ns):
    assert (ns["fma"]["blocks"], ns["fma"]["limiter"], ns["fma"]["occupancy"]) == (6, "registers", 75.0)
    assert (ns["tiled"]["blocks"], ns["tiled"]["limiter"], ns["tiled"]["occupancy"]) == (4, "shared_memory", 25.0)
    assert ns["passes"] == {"roofline": 5, "memory": 6, "occupancy": 1, "instructions": 6}  # the page's table


def _no_gpu(ns):
    assert ns["ds"].sizes == {"range": 15} and ns["ts"].sizes == {"time": 18019}
    assert set(ns["td"].kernel.values) == {"stream", "fma", "divergent"}
    assert ns["ph"].sizes["phase_id"] >= 2 and ns["ph"]["phase_duration"].attrs["units"] == "ns"


def _datatree(ns):
    assert ns["spans"].sizes == {"span": 3} and ns["frame"]["span_path"].tolist() == ["stream", "fma", "divergent"]
    assert len(ns["tree"].to_dataset().to_dataframe()) == 18019  # the root: one row per sample
    assert ns["back"].identical(ns["ts"])


CHECKS = {("index.md", 0): _no_gpu, ("sol.md", 1): _sol, ("multi-gpu.md", 1): _multi_gpu, ("trace.md", 0): _trace, ("phases.md", 0): _phases, ("phases.md", 1): _phase_topdown, ("topdown.md", 0): _topdown, ("metrics.md", 0): _metrics,
          ("report.md", 1): _report, ("report.md", 2): _compare, ("pm-sampling.md", 1): _datatree}


@pytest.mark.parametrize("page, index, code, gpu", list(snippets()))
def test_doc_snippet_runs_on_recordings(page, index, code, gpu, tmp_path, monkeypatch):
    if gpu:
        pytest.skip("needs a GPU (marked <!-- gpu -->); run on the device")
    monkeypatch.chdir(tmp_path)  # what a snippet writes goes there, not into the checkout
    ns = {}  # a snippet defines every name it uses (gs.example_dataset opens the shipped recordings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's coverage warning
        exec(compile(code, f"{page}[{index}]", "exec"), ns)
    plt.close("all")
    check = CHECKS.get((page, index))
    assert check is not None, f"{page} block {index} runs; add a check on its values to CHECKS"
    check(ns)


# -- the outputs the pages show are what gpuscope prints -------------------------------------------------------

CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
NUMBER = re.compile(r"<?-?\d[\d,.]*%?")


def _shown(page):
    """(command, the output the page shows under it) for each ``$ ...`` line of the page's console blocks that
    reads only the recordings in gpuscope/data, so runs without a GPU."""
    for block in CONSOLE.findall((ROOT / "docs" / page).read_text()):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = part.partition("\n")
            if "gpuscope/data/" in command:
                yield command, output


SHOWN = [pytest.param(c, o, id=f"{page}: {c}") for page in ("report.md", "quickstart.md") for c, o in _shown(page)]


def _words(text):
    return text.split()


def test_the_report_page_shows_real_commands():
    assert len([p for p in SHOWN if p.id.startswith("report.md")]) >= 3


@pytest.mark.parametrize("command, shown", SHOWN)
def test_shown_output_is_what_gpuscope_prints(command, shown, capsys, monkeypatch):
    from gpuscope import cli

    line, *pipe = command.split("|")
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in itertools.takewhile(lambda w: "=" in w, words))
    argv = words[len(env):]
    assert argv[0] == "gpuscope", command
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        assert cli.main(argv[1:]) == 0
    out = capsys.readouterr().out
    for stage in pipe:  # `| head -N`, the one filter the pages use
        count = re.fullmatch(r"\s*head -(\d+)\s*", stage)
        assert count, f"{command}: only '| head -N' can follow a command in the docs"
        out = "\n".join(out.splitlines()[: int(count.group(1))])
    assert _words(out) == _words(shown)  # the same text, whitespace aside


def test_quickstart_report_is_laid_out_as_gpuscope_prints_it():
    """The quickstart's report comes from a GPU run of saxpy; the recording's streaming kernel is the same kind
    of kernel (memory-bound, 3 launches): its report at the same width must read the same but for the numbers."""
    import numpy as np

    text = (ROOT / "docs" / "quickstart.md").read_text()
    start = text.index("gpuscope report: 3 launches")
    shown = text[start:text.index("```", start)]
    width = int(re.search(r"in a terminal (\d+) characters wide", text).group(1))
    ds = gs.open_dataset(gs.__path__[0] + "/data/demo_launches.nc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        consistent = gs.topdown(ds)["consistent"].values  # a saxpy run collects with the consistent pass plan
    saxpy = ds.isel(range=np.flatnonzero((ds["kernel"].values == "stream") & consistent)[:3])
    saxpy = saxpy.assign_coords(kernel=("range", np.array(["saxpy"] * 3)), name=("range", np.array(["saxpy"] * 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        real = gs.report(saxpy.assign_attrs(metric_set="topdown")).to_text(width=width)
    assert _words(NUMBER.sub("#", real)) == _words(NUMBER.sub("#", shown))


def test_every_page_is_in_the_guide():
    index = (ROOT / "docs" / "index.md").read_text()
    for path in DOCS[:-1]:
        if path.name != "index.md":
            assert path.stem in index, f"{path.name} is not linked from docs/index.md"


def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    pytest.importorskip("myst_parser")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(ROOT / "docs"),
                             str(tmp_path / "html")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    api = (tmp_path / "html" / "api.html").read_text()
    assert "to_dataframe" in api and "open_dataset" in api
    shutil.rmtree(tmp_path / "html")


# -- issue 53, item 5: docs that are true ------------------------------------------------------------------------

def _headings(path: Path, deepest: int) -> set[str]:
    """The anchors of *path*'s headings down to level *deepest*, as GitHub and MyST (the same rule) make them."""
    from myst_parser.slugs import github_slugify

    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {github_slugify(m.group(2)) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.M)
            if len(m.group(1)) <= deepest}


def test_every_anchor_leads_to_a_heading_on_github_and_in_sphinx():
    conf = (ROOT / "docs" / "conf.py").read_text()
    deepest = int(re.search(r"myst_heading_anchors = (\d)", conf).group(1))  # Sphinx makes anchors this deep
    broken = []
    for page in DOCS:
        for m in re.finditer(r"\]\(([\w./-]*\.md)?#([^)]+)\)", page.read_text()):
            target = (page.parent / m.group(1)) if m.group(1) else page
            if not target.exists() or m.group(2) not in _headings(target, deepest):
                broken.append(f"{page.name}: {m.group(0)}")
    assert broken == []


def test_no_blank_line_breaks_a_table():
    for page in DOCS:
        lines = page.read_text().splitlines()
        gaps = [i + 1 for i in range(1, len(lines) - 2)  # a row after the gap, not the header of another table
                if not lines[i].strip() and lines[i - 1].startswith("|") and lines[i + 1].startswith("|")
                and not re.match(r"\|\s*:?-", lines[i + 2])]
        assert gaps == [], f"{page.name}: blank line inside a table at line(s) {gaps}"


def test_the_topdown_set_has_its_pass_count_wherever_it_is_described():
    passes = gs.count_passes("topdown", chip="GH100")
    said = re.compile(r"(\d+) passes on an H100|(\d+) for `topdown`|`topdown` set, (\d+) passes|"
                      r"`topdown` set \((\d+) passes|`topdown` set takes (\d+) passes")
    for page in DOCS:
        if page.name == "measurements.md":  # a record of what was measured at the time
            continue
        counts = [int(next(g for g in m.groups() if g)) for m in said.finditer(page.read_text())]
        assert all(c == passes for c in counts), (page.name, counts)


def test_the_merge_the_docs_show_is_silent():
    import xarray as xr

    shown = [m for page in DOCS for m in re.findall(r"xr\.merge\(\[[^`]*\)", page.read_text())]
    assert shown and all("compat=" in m for m in shown), shown
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's known coverage warning
        ds = gs.example_dataset("demo_launches")
        td = gs.topdown(ds)
        warnings.simplefilter("error")
        merged = xr.merge([ds, td], compat="no_conflicts")
    assert set(td.data_vars) <= set(merged.data_vars) and merged.sizes == ds.sizes


def test_example_datasets_open_by_name_and_a_wrong_name_lists_them():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        assert gs.example_dataset("demo_launches").sizes == {"range": 15}
        assert gs.example_dataset("demo_timeseries.nc").sizes == {"time": 18019}
    with pytest.raises(ValueError, match="no example dataset named 'demo'.*'demo_launches'.*'demo_timeseries'"):
        gs.example_dataset("demo")


def test_the_quickstart_shows_rows_by_number():
    text = (ROOT / "docs" / "quickstart.md").read_text()
    block = text[text.index("      kernel  launch  grid_x"):]
    rows = block.splitlines()[2:5]
    assert [r.split()[0] for r in rows] == ["0", "1", "2"] and all(r.split()[1] == "saxpy" for r in rows)


def test_a_reader_without_a_gpu_finds_where_to_start():
    index = (ROOT / "docs" / "index.md").read_text()
    start = index[index.index("## No GPU? Start here"):]
    assert 'gs.example_dataset("demo_launches")' in start.split("##")[1]
