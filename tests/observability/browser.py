"""Headless Chromium driven by Selenium, for the tests of servo-monitor's page.

Chromium and its driver are Debian's (``chromium``, ``chromium-driver``; ``make
observability-tools`` installs them): the tests that need them are marked ``observability``
and run by ``make test-observability``, which CI runs.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: Where the tests keep what a person would look at (the page's screenshot).
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def tool(name: str) -> str:
    """The path of a Debian tool the observability tests need; a missing one fails (not skips) them."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run `make observability-tools` "
            "(apt-get install chromium chromium-driver prometheus)"
        )
    return path


@contextmanager
def chromium(width: int = 1400, height: int = 1100) -> Iterator[Any]:
    """A headless Chromium session (a Selenium ``WebDriver``), quit at the end."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ModuleNotFoundError:
        pytest.fail("selenium is not installed: pip install -e '.[dev]' (make setup)")

    options = webdriver.ChromeOptions()
    options.binary_location = tool("chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(tool("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(driver: Any, condition: Callable[[Any], Any], timeout: float, what: str) -> Any:
    """Selenium's explicit wait: polls ``condition(driver)`` until it is truthy."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None
