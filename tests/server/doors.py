"""Every door over one front, in process, for the door tests (tests/server/test_door_congruence.py,
test_mcp_door.py): gRPC, the OpenAI-compatible HTTP door and the MCP door on one event loop in a
thread, over the real embedder and an index of three documents with access groups, and a generator
fake (named as such). Callers are told apart by named keys: `alice` is granted the `secret` group,
`bob` nothing (he reads only documents marked public). The fixtures are in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.build import build_index
from ragserve.api_keys import add_key
from ragserve.config import Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.server.app import make_front
from ragserve.server.grpc.server import build_grpc_server
from ragserve.server.grpc.servicer import RagServicer
from ragserve.server.http.app import http_app
from ragserve.server.http.listener import HttpListener
from ragserve.server.mcp.door import McpDoor
from ragserve.server.openai.door import OpenAIDoor
from tests.fakes import FakeGenerator
from tests.helpers import free_port

DOCS = {
    "zephyr-launch.md": ("secret", "Project Zephyr launch code\nThe launch code of Project Zephyr is 4417."),
    "zephyr-public.md": ("public", "Project Zephyr\nProject Zephyr is a weather balloon programme from Kiruna."),
    "tides.md": ("public", "Tides\nOcean tides are caused mainly by the gravitational pull of the moon."),
}
SECRET_DOC = "zephyr-launch.md"
QUESTION = "What is the launch code of Project Zephyr?"
MAX_QUERY_CHARS = 300
# The fake engine's answer in the door and page tests: one sentence citing passage [1].
CITED_ANSWER = ["It ", "is ", "[1]."]


@dataclass
class Doors:
    grpc_target: str
    http_url: str
    keys: dict[str, str]
    key_file: Path
    front: Any
    generator: FakeGenerator


def build_access_index(root: Path, embedder: SentenceTransformerEmbedder) -> Path:
    (root / "docs").mkdir()
    for name, (group, text) in DOCS.items():
        (root / "docs" / name).write_text(f"---\ngroups: [{group}]\n---\n# {text}")
    build_index(root / "docs", root / "idx", embedder, progress=False)
    return root / "idx"


@contextlib.contextmanager
def serving_doors(
    index: Path,
    embedder: SentenceTransformerEmbedder,
    key_file: Path,
    generator: FakeGenerator,
    http: dict[str, Any] | None = None,
    access: dict[str, Any] | None = None,
    **limits: Any,
) -> Iterator[Doors]:
    """`http`: the listener's settings beside its port; `access`: TLS files beside the keys."""
    keys = {name: add_key(key_file, name) for name in ("alice", "bob")}
    settings = Settings(
        transport={"port": free_port()},
        http={"port": free_port(), **(http or {})},
        mcp={"enabled": True},
        access={"api_keys_file": str(key_file), **(access or {})},
        grants={"field": "groups", "grants": json.dumps({"alice": ["secret"]})},
        requests={"max_query_chars": MAX_QUERY_CHARS},
        history={"max_history_turns": 2, "max_turn_chars": 200},
        limits={"max_call_s": 5.0, **limits},
    )
    executor = ThreadPoolExecutor(2)
    front = make_front(settings, assemble_pipeline(embedder, HnswIndex.load(index), generator, executor))
    with _serving(settings, front):
        scheme = "https" if settings.access.tls_cert_file else "http"
        grpc_target, http_url = f"127.0.0.1:{settings.transport.port}", f"{scheme}://127.0.0.1:{settings.http.port}"
        yield Doors(grpc_target, http_url, keys, key_file, front, generator)
    executor.shutdown()


@contextlib.contextmanager
def _serving(settings: Settings, front: Any) -> Iterator[None]:
    """Every door over one front, on one event loop in a thread, as the server runs them."""
    started, box = threading.Event(), []

    async def main() -> None:
        stop = asyncio.Event()
        box.extend([asyncio.get_running_loop(), stop])
        server, _ = build_grpc_server(settings, RagServicer(front))
        server.add_insecure_port(f"127.0.0.1:{settings.transport.port}")
        await server.start()
        mcp = McpDoor(settings, front)
        await mcp.start()
        app = http_app([*OpenAIDoor(settings, front).routes, *mcp.routes], front.identity, settings.http)
        http = HttpListener(app, "127.0.0.1", settings.http.port, settings)
        await http.start()
        started.set()
        await stop.wait()
        await http.close()
        await mcp.close()
        await server.stop(None)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert started.wait(30), "the doors did not start"
    try:
        yield
    finally:
        box[0].call_soon_threadsafe(box[1].set)
        thread.join(30)


async def call_tool(
    http_url: str, credential: str | None, tool: str, arguments: dict[str, Any], progress: Any = None
) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"authorization": credential} if credential else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
    async with http, Client(streamable_http_client(f"{http_url}/mcp", http_client=http)) as client:
        return await client.call_tool(tool, arguments, progress_callback=progress)
