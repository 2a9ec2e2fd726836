"""Headless Chromium for the report tests (`splitformer analyze`, `splitformer theory`), and
the one way they skip without it:

    with headless_chromium() as (driver, By):
        driver.get(page.resolve().as_uri())
        ...

Chromium and chromedriver must be Debian's, at CHROMIUM and CHROMEDRIVER (`make data`
installs them; CI runs it), and selenium the dev extra's; without them the test skips with a
reason naming what is missing (a test that opens the browser carries ``@needs("chromium")``
too, so that it skips before its fixtures are built and ``make test-data`` selects it). The
browser runs headless, without a sandbox or the GPU, at 1200 x 900, and keeps the page's
console log ("goog:loggingPrefs", for ``driver.get_log("browser")``); it quits on leaving the
block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _optional_data import skip_unless

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1200,900")


@contextlib.contextmanager
def headless_chromium() -> Iterator[tuple[Any, Any]]:
    """(driver, By): a selenium Chrome driver on CHROMIUM and selenium's locator names; skips
    the test without chromium, chromedriver or selenium (module docstring)."""
    skip_unless("chromium")  # also when SPLITFORMER_TEST_NO_DATA hides it
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():  # elsewhere on PATH is not what
        pytest.skip(f"needs chromium and chromedriver at {CHROMIUM} and {CHROMEDRIVER}: "  # the
                    "`make data` installs them (CI runs make data)")  # test drives: skip too
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev "
                                    "extra: pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    for arg in ARGUMENTS:
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver, By
    finally:
        driver.quit()
