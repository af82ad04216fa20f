"""The HTML pages of the shipped recordings, as the browser tests open them and docs/figures shows them.

    python -m tests.browser.pages OUT_DIR      # writes every page and, with Chromium, html_<name>.png of each

Pages: the demo's kernel-mode Top-Down launches, the four speed-of-light sets recorded on an H200 over the same five
launches (held in one Dataset, as ``--set full`` holds them), the demo's PM timeline with its phases and ranges, the
PC samples of tests/fixtures/pc with their source, and the comparison of the roofline set on the H200 and the H100.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SETS = ("roofline", "memory", "occupancy", "instructions")


def sol_full(folder: str = "sol"):
    """The four speed-of-light sets of tests/fixtures/<folder>, recorded one after another over the same five
    launches (same kernels, grids, order), as one Dataset: the roofline set's rows with every set's metrics."""
    import gpuscope as gs

    parts = [gs.open_dataset(FIXTURES / folder / f"sol_{s}_gh100.nc") for s in SETS]
    first = parts[0]
    for part in parts[1:]:
        assert part["kernel"].values.tolist() == first["kernel"].values.tolist()
        first = first.assign({v: ("range", part[v].values, part[v].attrs) for v in part.data_vars
                              if v not in first.data_vars})
    return first.assign_attrs(metric_set="full")


def datasets():
    """name -> (what the page is made from, the function that makes it)."""
    import gpuscope as gs
    from gpuscope._results.html_pages import compare_html, report_html
    from gpuscope._results.report import report

    data = Path(gs.__file__).parent / "data"

    def page(ds, path):
        return report_html(ds, path, report=report)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tests.fixtures.pc import recording

        return {
            "launches": (gs.open_dataset(data / "demo_launches.nc"), page),
            "full": (sol_full(), page),
            "timeline": (gs.open_dataset(data / "demo_timeseries.nc"), page),
            "source": (recording.dataset(), page),
            "compare": (gs.compare(sol_full("sol_h100"), sol_full()), compare_html),
        }


def write(out: Path) -> dict[str, Path]:
    """Every page into *out*: name -> path."""
    import gpuscope as gs

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        for name, (ds, make) in datasets().items():
            paths[name] = out / f"{name}.html"
            make(ds, paths[name])
    return paths


def browser():
    """A headless Chromium (Debian's chromium and chromium-driver) driven by Selenium; the reason when there is
    none: (driver, None) or (None, reason)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return None, ("no Chromium: the browser tests need Debian's chromium and chromium-driver (apt-get install -y "
                      "chromium chromium-driver; the README's test command installs them)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "no selenium: pip install -e '.[test]'"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1800", "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options), None


def screenshots(paths: dict[str, Path], out: Path) -> dict[str, Path]:
    """html_<name>.png of each page, as Chromium shows it."""
    driver, reason = browser()
    if driver is None:
        raise SystemExit(reason)
    shots = {}
    try:
        for name, page in paths.items():
            driver.get(page.as_uri())
            ready(driver)
            shots[name] = out / f"html_{name}.png"
            driver.save_screenshot(str(shots[name]))
    finally:
        driver.quit()
    return shots


def ready(driver, timeout: float = 120) -> None:
    """Wait until the page's tables and figures are drawn."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "return document.readyState === 'complete'"
        " && document.querySelectorAll('table[id^=table-]').length"
        "    === document.querySelectorAll('table.dataTable[id^=table-]').length"
        " && Array.from(document.querySelectorAll('.plotly-graph-div')).every(p => p._fullLayout)"))


def make_screenshots(target: Path) -> list[Path]:
    """html_<name>.png of every page into *target*, as docs/figures keeps them (a 64-colour palette, as
    docs/figures/make_figures.py keeps its PNGs); nothing without Chromium."""
    import tempfile

    from PIL import Image

    target.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for shot in screenshots(write(Path(tmp)), target).values():
            with Image.open(shot) as image:
                small = image.convert("RGB").quantize(64, method=Image.Quantize.MEDIANCUT)
            small.save(shot, optimize=True)
            written.append(shot)
    return written


if __name__ == "__main__":
    for shot in make_screenshots(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "figures"):
        print(shot)
