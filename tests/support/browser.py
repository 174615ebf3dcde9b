"""Debian's Chromium, headless, driven by Python's playwright, for the status page's tests.

    def test_x(browser: Browser) -> None:     # the fixture, from tests/conftest.py
        page = browser.new_context().new_page()
        page.goto(url)

The browser is /usr/bin/chromium (package chromium, installed by
scripts/bootstrap from scripts/debian-packages.txt); playwright's own
browsers are never downloaded. Playwright starts it with a new, empty
profile directory of its own (its --user-data-dir) and the flags below:
without the background-networking ones Chromium keeps trying to reach
Google's hosts, which this machine's closed network refuses.

Screenshots and traces go to ARTIFACTS (.cache/artifacts/status-page/,
outside git), kept after the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Playwright, sync_playwright

from tests.support.programs import ROOT

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # /dev/shm may be small where CI runs in a container; temporary files instead.
    "--disable-dev-shm-usage",
)
ARTIFACTS = ROOT / ".cache" / "artifacts" / "status-page"


def artifact(name: str) -> Path:
    """A path for a file the run keeps (a screenshot), its directory made."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


def launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=list(FLAGS))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per test module (closed with it: no driver or
    browser process outlives the module's tests); each test makes its own
    context (cookies)."""
    with sync_playwright() as playwright:
        running = launch(playwright)
        try:
            yield running
        finally:
            running.close()
