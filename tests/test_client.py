"""ragserve.client over real gRPC: retry on UNAVAILABLE (service config), default deadlines, streaming.

The servers here are in-process grpc.aio servers with fake servicers (named Fake*), so that the
failure patterns are exact; the client's behaviour against the real service is in tests/e2e.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc


class FakeFlakyRagService(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    """Fails the first `failures` calls with UNAVAILABLE, then answers."""

    def __init__(self, failures: int, delay_s: float = 0.0) -> None:
        self.failures = failures
        self.delay_s = delay_s
        self.attempts = 0

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        self.attempts += 1
        if self.attempts <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        await asyncio.sleep(self.delay_s)
        return pb.RetrieveResponse(passages=[pb.Passage(doc_id="d", chunk_id="d#0", text="t", score=1.0)])

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.QueryEvent]:
        yield pb.QueryEvent(retrieval=pb.RetrievalEvent(passages=[pb.Passage(doc_id="d")]))
        for word in ("a", "b", "c"):
            await asyncio.sleep(self.delay_s)
            yield pb.QueryEvent(token=pb.TokenEvent(text=word))
        yield pb.QueryEvent(final=pb.FinalEvent(finish_reason="stop"))


async def _serve(servicer: FakeFlakyRagService) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_RagServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_retries_unavailable_then_succeeds() -> None:
    async def run() -> int:
        servicer = FakeFlakyRagService(failures=2)
        server, target = await _serve(servicer)
        try:
            async with RagClient(target) as client:
                reply = await client.retrieve("q")
                assert reply.passages[0].doc_id == "d"
        finally:
            await server.stop(None)
        return servicer.attempts

    assert asyncio.run(run()) == 3


def test_gives_up_after_the_configured_attempts() -> None:
    async def run() -> tuple[grpc.StatusCode, int]:
        servicer = FakeFlakyRagService(failures=10)
        server, target = await _serve(servicer)
        try:
            async with RagClient(target) as client:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await client.retrieve("q")
        finally:
            await server.stop(None)
        return info.value.code(), servicer.attempts

    assert asyncio.run(run()) == (grpc.StatusCode.UNAVAILABLE, 3)


def test_default_deadline_applies() -> None:
    async def run() -> tuple[grpc.StatusCode, float]:
        server, target = await _serve(FakeFlakyRagService(failures=0, delay_s=2.0))
        try:
            async with RagClient(target, default_timeout_s=0.3) as client:
                started = time.perf_counter()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await client.retrieve("q")
                return info.value.code(), time.perf_counter() - started
        finally:
            await server.stop(None)

    code, elapsed = asyncio.run(run())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.25 < elapsed < 1.5


def test_query_is_an_async_iterator_of_events() -> None:
    async def run() -> list[str]:
        server, target = await _serve(FakeFlakyRagService(failures=0, delay_s=0.01))
        try:
            async with RagClient(target) as client:
                return [e.WhichOneof("event") async for e in client.query("q")]
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == ["retrieval", "token", "token", "token", "final"]
