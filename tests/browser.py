"""Debian's Chromium driven by playwright's Python client, for the viewer's browser tests
(tests/test_view.py) and its benchmark (benches/test_view.py). Without either, they skip with
a reason that says what to install."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium browser (playwright's Browser), closed on exit."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the viewer's browser tests need playwright's Python client: pip install playwright"
    )
    if CHROMIUM is None:
        pytest.skip("the viewer's browser tests need Debian's Chromium: apt-get install -y chromium")
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
