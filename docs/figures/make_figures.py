"""Render the figures of the docs from the H100 recordings shipped with gpuscope.

    python docs/figures/make_figures.py [OUT_DIR]          # default: docs/figures
    python docs/figures/make_figures.py [OUT_DIR] --html   # also html_*.png: the HTML report's pages in Chromium

Writes the PNGs that docs/topdown.md, phases.md, sol.md and pc-sampling.md show (FIGURES names them), from the
recordings shipped with the package and those of tests/fixtures (the roofline and memory sets recorded on an H200,
PC samples on an H100); tests/unit/test_docs_pngs.py runs this script into a temporary folder, checks that every
figure the pages reference is made, and that a reader of the printed page finds nothing to complain about.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope as gs  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

DATA = Path(gs.__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
#: file name -> the page that shows it
FIGURES = {
    "topdown_levels.png": "topdown.md",
    "topdown_per_kernel.png": "topdown.md",
    "hierarchy.png": "topdown.md",
    "timeline.png": "phases.md",
    "phase_topdown.png": "phases.md",
    "roofline_fp32.png": "sol.md",
    "memory_chart.png": "sol.md",
    "pc_lines.png": "pc-sampling.md",
    "pc_kernels.png": "pc-sampling.md",
}


def figures():
    """(file name, Figure) for every figure of the docs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's coverage warning
        ds = gs.open_dataset(DATA / "demo_launches.nc")
        td = gs.topdown(ds)
        per_kernel = gs.aggregate(td, by="kernel")
        yield "topdown_levels.png", td.gpuscope.plot.topdown(level=[1, 2])
        yield "topdown_per_kernel.png", per_kernel.gpuscope.plot.topdown(level=3)
        yield "hierarchy.png", per_kernel.gpuscope.plot.hierarchy()
        ts = gs.open_dataset(DATA / "demo_timeseries.nc")
        yield "timeline.png", gs.phases(ts, label_tolerance=2).gpuscope.plot.timeline()
        ph = gs.phases(ts)  # as docs/phases.md joins them
        yield "phase_topdown.png", ph.gpuscope.plot.phase_topdown(gs.dynamic(td, phases=ph), level=2)
        sol = FIXTURES / "sol"
        yield "roofline_fp32.png", gs.open_dataset(sol / "sol_roofline_gh100.nc").gpuscope.plot.roofline("fp32")
        yield "memory_chart.png", gs.open_dataset(sol / "sol_memory_gh100.nc").gpuscope.plot.memory_chart("stream")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gpuscope.metrics import pc_plot
    from tests.fixtures.pc import recording

    pc = recording.dataset()
    yield "pc_lines.png", pc_plot.plot_line_stalls(pc, "fma")
    yield "pc_kernels.png", pc_plot.plot_kernel_stalls(pc)


def main(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures():
        path = out / name
        fig.savefig(path, dpi=min(fig.dpi, 150), bbox_inches="tight")
        plt.close(fig)
        # a 64-colour palette: tens of KB, not hundreds (the plots use few colours)
        with Image.open(path) as image:
            small = image.convert("RGB").quantize(64, method=Image.Quantize.MEDIANCUT)
        small.save(path, optimize=True)
        written.append(path)
    return written


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--html"]
    target = Path(args[0]) if args else Path(__file__).parent
    for p in main(target):
        print(p)
    if "--html" in sys.argv[1:]:  # the pages of the shipped recordings, as tests/browser opens them
        sys.path.insert(0, str(ROOT))
        from tests.browser.pages import make_screenshots  # exits saying why where there is no Chromium

        for p in make_screenshots(target):
            print(p)
