"""A real browser for the viewer's tests: Debian's chromium, driven by Playwright.

Playwright cannot download its own browsers here (no network), so it launches the system
chromium by path. One browser per test module keeps the tests fast; each test opens its
own page (and context, so cookies never leak from one test into another).

Loaded as a pytest plugin by tests/conftest.py: a test module that defines a ``viewer``
fixture (the base URL of the viewer it serves) gets ``browser`` and ``page`` from here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: Where the system browser is (Debian's chromium package); PRIME_RUNS_CHROMIUM overrides it.
CHROMIUM = os.environ.get("PRIME_RUNS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: Set to a folder (e.g. docs/) to keep the screenshots the tests take (docs/viewer.md).
SCREENSHOT_DIR = os.environ.get("PRIME_RUNS_VIEWER_SCREENSHOTS")
#: The most one screenshot may weigh: docs/viewer.md shows them.
MAX_SCREENSHOT_BYTES = 200_000
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


@contextmanager
def launched() -> Iterator[Any]:
    """The chromium browser for a ``with`` block (a Playwright ``Browser``)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):  # fail, never skip: the browser tests are part of CI
        raise RuntimeError(f"no chromium at {CHROMIUM}: apt-get install chromium (or set PRIME_RUNS_CHROMIUM)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium per test module."""
    with launched() as browser:
        yield browser


@pytest.fixture
def page(browser: Any, viewer: str) -> Iterator[Any]:
    """A fresh page in a context of its own; afterwards, no script raised an error and
    nothing was loaded from anywhere but the viewer itself (no CDN, no outside asset)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    requested: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    context.on("request", lambda request: requested.append(request.url))
    yield page
    context.close()
    assert errors == []
    assert requested and [url for url in requested if not url.startswith(viewer + "/")] == []


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    """``page`` as the PNG ``name``: in :data:`SCREENSHOT_DIR` when it is set, else in the
    test's own folder; either way small enough for the docs."""
    path = (Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path) / name
    page.screenshot(path=str(path), type="png")
    assert path.stat().st_size < MAX_SCREENSHOT_BYTES
