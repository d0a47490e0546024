"""The page over the real front, embedder and index (tests/server/doors.py's three documents and
keys), with a generator fake (named as such) whose words and pace each test sets: the HTTP
listener alone (the OpenAI door and the page's routes), on an event loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from ragserve.api_keys import add_key
from ragserve.config import Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.server.app import make_front
from ragserve.server.http.app import http_app
from ragserve.server.http.listener import HttpListener
from ragserve.server.openai.door import OpenAIDoor
from ragserve.server.page import page_routes
from tests.fakes import FakeGenerator
from tests.helpers import free_port
from tests.server.doors import CITED_ANSWER

REPO = Path(__file__).resolve().parents[2]


def output_folder() -> Path:
    """Where the screenshots and the page's own timings go: PAGE_TEST_OUTPUT, else
    test-output/page/ at the repository's root (kept by CI with the run's output)."""
    folder = Path(os.environ.get("PAGE_TEST_OUTPUT") or REPO / "test-output") / "page"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def chromium() -> str | None:
    """Debian's Chromium (apt-get install chromium), or RAGSERVE_TEST_CHROMIUM."""
    named = os.environ.get("RAGSERVE_TEST_CHROMIUM")
    if named:
        return named
    return next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)


@dataclass
class PageServer:
    url: str
    keys: dict[str, str]
    generator: FakeGenerator
    settings: Settings


@contextlib.contextmanager
def serving_page(
    index: Path, embedder: SentenceTransformerEmbedder, key_file: Path, generator: FakeGenerator, enabled: bool = True
) -> Iterator[PageServer]:
    keys = {name: add_key(key_file, name) for name in ("alice", "bob")}
    settings = Settings(
        transport={"port": free_port()},
        http={"port": free_port()},
        page={"enabled": enabled},
        access={"api_keys_file": str(key_file)},
        grants={"field": "groups", "grants": json.dumps({"alice": ["secret"]})},
        history={"max_history_turns": 4, "max_turn_chars": 400},
        limits={"max_call_s": 10.0},
    )
    executor = ThreadPoolExecutor(2)
    front = make_front(settings, assemble_pipeline(embedder, HnswIndex.load(index), generator, executor))
    started, box = threading.Event(), []

    async def main() -> None:
        stop = asyncio.Event()
        box.extend([asyncio.get_running_loop(), stop])
        routes = [*OpenAIDoor(settings, front).routes, *page_routes(front, settings)]
        app = http_app(routes, front.identity, settings.http)
        http = HttpListener(app, "127.0.0.1", settings.http.port, settings)
        await http.start()
        started.set()
        await stop.wait()
        await http.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert started.wait(30), "the HTTP listener did not start"
    try:
        yield PageServer(f"http://127.0.0.1:{settings.http.port}", keys, generator, settings)
    finally:
        box[0].call_soon_threadsafe(box[1].set)
        thread.join(30)
        executor.shutdown()


@contextlib.contextmanager
def serving_cited_page(
    index: Path, embedder: SentenceTransformerEmbedder, factory: pytest.TempPathFactory
) -> Iterator[PageServer]:
    """The page over `index`, keys in a fresh folder, answering "It is [1]." (a citation)."""
    key_file = factory.mktemp("page-keys") / "keys"
    with serving_page(index, embedder, key_file, FakeGenerator(words=CITED_ANSWER)) as server:
        yield server
