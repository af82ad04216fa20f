"""The docs' figures (issue 37, item 11): docs/figures/make_figures.py renders them from the shipped H100
recordings, every figure the pages show is one it makes, the PNGs stay small, and a reader of the printed page finds
nothing to complain about (tests/unit/legibility.py)."""

import re
import runpy
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from . import legibility

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "figures" / "make_figures.py"
IMAGE = re.compile(r"!\[[^\]]+\]\(figures/([^)]+\.png)\)")


def test_the_script_makes_every_figure_the_pages_show(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, cwd=tmp_path,
                   env={"PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PATH": ""})
    figures = runpy.run_path(str(SCRIPT), run_name="figures")["FIGURES"]
    made = sorted(p.name for p in tmp_path.glob("*.png"))
    assert made == sorted(figures)
    for name, page in figures.items():
        assert name in IMAGE.findall((ROOT / "docs" / page).read_text()), f"{page} does not show {name}"
        with Image.open(tmp_path / name) as image:
            assert image.size[0] >= 900  # legible when printed, not a thumbnail
        assert (tmp_path / name).stat().st_size < 120_000  # tens of KB
    shown = {n for page in set(figures.values()) for n in IMAGE.findall((ROOT / "docs" / page).read_text())}
    assert shown <= set(figures)  # nothing the pages show is left out of the script
    assert all((ROOT / "docs" / "figures" / n).is_file() for n in shown)  # and the checkout has them


@pytest.fixture(scope="module")
def doc_figures():
    """Every figure of the docs, as the script draws it (closed after the module's tests)."""
    made = dict(runpy.run_path(str(SCRIPT), run_name="figures")["figures"]())
    yield made
    plt.close("all")


def test_every_figure_of_the_docs_reads_well_in_print(doc_figures):
    for name, fig in doc_figures.items():
        assert legibility.problems(fig) == [], name
