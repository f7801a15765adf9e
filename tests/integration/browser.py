"""A real headless browser for page tests: Debian's chromium, driven through its
chromium-driver by selenium (no browser download). Pages are loaded as a person would
load them; screenshots go to build/screenshots (`make docs-pictures` copies them into docs/).
"""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pyhpc import paths

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
#: Where the tests' screenshots go: a build folder, never the checkout's docs/.
SCREENSHOTS = paths.ROOT / "build" / "screenshots"


@contextmanager
def chromium(width: int = 1280, height: int = 900, insecure_tls: bool = False,
             resolve: dict[str, str] | None = None) -> Iterator[Any]:
    """A headless chromium session (a selenium WebDriver). ``insecure_tls``: accept a
    certificate from a CA this browser does not know (the deploy's own CA). ``resolve``:
    host names this machine's resolver does not know, each to its address (hostlab's)."""
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.fail("chromium and chromium-driver are missing: `make test` installs them "
                    "(Debian's packages)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    if insecure_tls:
        options.add_argument("--ignore-certificate-errors")
    if resolve:
        options.add_argument("--host-resolver-rules="
                             + ", ".join(f"MAP {name} {address}" for name, address in resolve.items()))
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, path: Path) -> Path:
    """The page as the browser shows it, as a PNG at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
