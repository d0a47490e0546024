"""The page's routes without a browser (the browser tests are tests/browser): off by default, its
files with a strict Content-Security-Policy from the package, its JSON calls through the front with
the same credential, Host check and grants as every HTTP door."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from tests.browser.page_server import PageServer, serving_cited_page, serving_page
from tests.fakes import FakeGenerator
from tests.server.doors import SECRET_DOC


@pytest.fixture(scope="module")
def page(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[PageServer]:
    with serving_cited_page(access_index, embedder, tmp_path_factory) as server:
        yield server


def _get(
    page: PageServer, path: str, key: str | None = None, params: dict[str, str] | None = None, **headers: str
) -> httpx.Response:
    sent = {"authorization": f"Bearer {page.keys[key]}"} if key else {}
    return httpx.get(f"{page.url}{path}", params=params, headers={**sent, **headers}, timeout=30)


def test_the_page_is_off_by_default(access_index: Path, tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    with serving_page(access_index, embedder, tmp_path / "keys", FakeGenerator(), enabled=False) as server:
        assert _get(server, "/ui/").status_code == 404
        assert _get(server, "/ui/api/info", "alice").status_code == 404


def test_its_files_come_from_the_package_with_a_strict_policy(page: PageServer) -> None:
    index = _get(page, "/ui/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    policy = index.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
    assert "frame-ancestors 'none'" in policy and index.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="static/app.js">' in index.text and "http" not in index.text.split("<body>")[0]
    script = _get(page, "/ui/static/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert _get(page, "/ui/static/../routes.py").status_code == 404
    assert _get(page, "/ui/static/missing.js").status_code == 404
    assert _get(page, "/ui/", Host="evil.example").status_code == 421  # the listener's Host check


def test_its_calls_ask_for_the_doors_credential(page: PageServer) -> None:
    assert _get(page, "/ui/api/info").status_code == 401
    refused = _get(page, "/ui/api/fields", Authorization="Bearer rsk_wrong")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    info = _get(page, "/ui/api/info", "alice")
    assert info.status_code == 200 and info.json()["index_version"] and info.headers["cache-control"] == "no-store"
    assert "groups" in _get(page, "/ui/api/fields", "bob").json()["fields"]


def test_a_source_is_read_within_the_callers_grant(page: PageServer) -> None:
    chunk = f"{SECRET_DOC}#0"
    shown = _get(page, "/ui/api/source", "alice", {"chunk_id": chunk, "start": "29", "end": "71"}).json()
    assert shown["found"] and shown["chunk_id"] == chunk
    marked = shown["text"][shown["quote_start"] - shown.get("text_start", 0) : shown["quote_end"]]
    assert marked == "The launch code of Project Zephyr is 4417."
    assert shown["location"]["section"] == ["Project Zephyr launch code"]
    assert _get(page, "/ui/api/source", "bob", {"chunk_id": chunk}).json() == {
        "found": False,
        "index_version": shown["index_version"],
        "chunk_id": chunk,
    }
    wrong = _get(page, "/ui/api/source", "alice", {"chunk_id": chunk, "start": "x"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "start"
    outside = _get(page, "/ui/api/source", "alice", {"chunk_id": chunk, "start": "0", "end": "999"})
    assert outside.status_code == 400
