"""A Qdrant that is down or silent: the request answers UNAVAILABLE within its budget, never INTERNAL.

Two endpoints that never give an answer: a closed port (refused at once) and a socket that
accepts connections but never replies (a hung server or a black-holing network path). The
client's own HTTP timeout is set far beyond the budget, so a prompt answer proves the budget bound.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from ragserve.client import RagClient
from ragserve.errors import Unavailable
from ragserve.factory import assemble_pipeline
from ragserve.index.qdrant_index import QdrantIndex
from tests.cache.inproc_server import serve_pipeline
from tests.fakes import FakeEmbedder

DIM = 4
BUDGET_MS = 300
CLIENT_HTTP_TIMEOUT_S = 60  # far beyond the budget: only the pipeline's bound can end the wait
# Generous slack for a loaded 2-core host; still a small fraction of the HTTP timeout above.
SLACK_S = 5.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts TCP connections (the kernel completes the handshake) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()  # nothing listens there now: connections are refused
    return port


def _index_at(port: int) -> QdrantIndex:
    meta = {"version": 1, "count": 10, "embedder_id": FakeEmbedder.model_id, "dim": DIM, "bm25": {}}
    from qdrant_client import QdrantClient

    client = QdrantClient(url=f"http://127.0.0.1:{port}", prefer_grpc=False, timeout=CLIENT_HTTP_TIMEOUT_S)
    return QdrantIndex(client, "docs_v000001", meta)


def test_search_on_a_down_qdrant_raises_unavailable(closed_port: int) -> None:
    index = _index_at(closed_port)
    with pytest.raises(Unavailable, match="Qdrant index is unavailable") as refused:
        index.search(np.ones(DIM, dtype=np.float32), 3, 16)
    # The caller learns the kind of failure only; the library's text (addresses, bodies) stays in the log.
    assert str(closed_port) not in str(refused.value) and "refused" not in str(refused.value).lower()
    with pytest.raises(Unavailable):
        index.search_lexical("tides and the moon", 3)


# A silent port waits out the search's budget floor: slow (CI runs it).
@pytest.mark.parametrize("endpoint", [pytest.param("silent_port", marks=pytest.mark.slow), "closed_port"])
def test_retrieve_answers_unavailable_within_the_budget(endpoint: str, request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue(endpoint)

    async def body() -> None:
        model_threads = ThreadPoolExecutor(1, thread_name_prefix="test-model")
        search_threads = ThreadPoolExecutor(2, thread_name_prefix="test-qdrant")
        # A constant query vector: the embedder is not what this test is about.
        pipeline = assemble_pipeline(
            FakeEmbedder(DIM, constant=True), _index_at(port), None, model_threads, search_executor=search_threads
        )
        async with serve_pipeline(pipeline) as target, RagClient(target, default_timeout_s=120) as client:
            started = time.monotonic()
            # Two at once on one model thread: a stuck search must not hold the embedding thread.
            results = await asyncio.gather(
                client.retrieve("tides and the moon", top_k=3, budget_ms=BUDGET_MS),
                client.retrieve("alpha particles", top_k=3, budget_ms=BUDGET_MS),
                return_exceptions=True,
            )
            elapsed = time.monotonic() - started
            # The model thread is free at once, even while search threads may still be stuck.
            assert model_threads.submit(lambda: "free").result(timeout=SLACK_S) == "free"
        model_threads.shutdown(wait=False, cancel_futures=True)
        search_threads.shutdown(wait=False, cancel_futures=True)
        for error in results:
            assert isinstance(error, grpc.aio.AioRpcError), error
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "internal error" not in (error.details() or "")
        assert elapsed < BUDGET_MS / 1000.0 + SLACK_S

    asyncio.run(body())
