"""The HTML reports of the shipped recordings, opened in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): no console errors, a table sorts and filters, the kernel list switches the
sections shown, and a screenshot of each page is not blank. Skipped, with the reason, without Chromium."""

from __future__ import annotations

import io
import time

import numpy as np

import pytest

pytest.importorskip("plotly", reason="the HTML report needs the html extra: pip install -e '.[test]'")
pytest.importorskip("itables", reason="the HTML report needs the html extra: pip install -e '.[test]'")

from tests.browser import pages  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return pages.write(tmp_path_factory.mktemp("html"))


@pytest.fixture(scope="module")
def driver():
    drv, reason = pages.browser()
    if drv is None:
        pytest.skip(reason)
    yield drv
    drv.quit()


def _open(driver, path):
    driver.get(path.as_uri())
    pages.ready(driver)
    return driver


def _column(driver, table: str, index: int) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(`#table-${arguments[0]} tbody tr`))"
        ".map(r => r.cells[arguments[1]].textContent.trim())", table, index)


@pytest.mark.parametrize("name", ["launches", "full", "timeline", "source", "compare"])
def test_page_opens_without_errors_and_is_not_blank(driver, written, name):
    _open(driver, written[name])
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    tables = driver.execute_script("return document.querySelectorAll('table.dataTable').length")
    figures = driver.execute_script("return document.querySelectorAll('.plotly-graph-div .main-svg').length")
    assert tables >= 1 and figures >= 1
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("L"), dtype=float)
    assert shot.std() > 10, "the screenshot is blank (one colour)"  # a white page: 0


def test_sorting_a_table_orders_its_rows(driver, written):
    _open(driver, written["launches"])
    headers = driver.execute_script(
        "return Array.from(document.querySelectorAll('#table-summary thead th')).map(h => h.textContent.trim())")
    retire = headers.index("retire [%]")  # as recorded, neither ascending nor descending: 74.8, 2.6, 30.8
    original = [float(v) for v in _column(driver, "summary", retire)]
    assert original not in (sorted(original), sorted(original, reverse=True))
    seen, before = [], original
    for _ in range(2):  # a click orders the column one way, the next the other way
        driver.find_elements("css selector", "#table-summary thead th")[retire].click()
        deadline = time.monotonic() + 10  # the table redraws after the click: wait for the new order
        while True:
            now = [float(v) for v in _column(driver, "summary", retire)]
            if now != before or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        seen.append(before := now)
    assert sorted(seen) == [sorted(original), sorted(original, reverse=True)]


def test_filtering_a_table_keeps_matching_rows(driver, written):
    _open(driver, written["launches"])
    box = driver.find_element("css selector", "#table-summary_wrapper input[type=search], "
                                              "div:has(> #table-summary) input[type=search]")
    box.send_keys("stream")
    assert _column(driver, "summary", 0) == ["stream"]


@pytest.mark.parametrize("name", ["launches", "source"])
def test_the_kernel_list_switches_the_sections(driver, written, name):
    from selenium.webdriver.support.ui import Select

    _open(driver, written[name])
    shown = "return Array.from(document.querySelectorAll('[data-kernel]')).filter(e => !e.hidden)" \
            ".map(e => [e.dataset.kernel, e.querySelector('.plotly-graph-div').getBoundingClientRect().width])"
    picker = Select(driver.find_element("id", "kernel"))
    keys = [o.get_attribute("value") for o in picker.options]
    assert len(keys) >= 2
    before = driver.execute_script(shown)
    picker.select_by_value(keys[1])
    after = driver.execute_script(shown)
    assert [k for k, _ in before] == [keys[0]] and [k for k, _ in after] == [keys[1]]
    assert after[0][1] > 300  # the newly shown figure is laid out to the page, not 0 wide
    assert driver.get_log("browser") == []
