"""The page's fixtures: a server with the page on (tests/browser/page_server.py) and Debian's
Chromium driven by Playwright. Without Chromium or Playwright the browser tests skip, except in
CI (CI=true), where they fail: deploy/local/setup.sh installs both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from tests.browser.page_server import PageServer, chromium, serving_cited_page
from tests.server.doors import build_access_index


@pytest.fixture(scope="module")
def page_index(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    return build_access_index(tmp_path_factory.mktemp("page"), embedder)


@pytest.fixture(scope="module")
def page_server(
    page_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[PageServer]:
    with serving_cited_page(page_index, embedder, tmp_path_factory) as server:
        yield server


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: deploy/local/setup.sh installs it")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install playwright)")
    executable = chromium()
    if executable is None:
        _missing("Chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()
