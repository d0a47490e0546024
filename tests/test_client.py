"""ragserve.client over real gRPC: retry on UNAVAILABLE (service config), default deadlines, streaming.

The servers here are in-process grpc.aio servers with fake servicers (named Fake*), so that the
failure patterns are exact; the client's behaviour against the real service is in tests/e2e.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.fakes import FakeRagService


async def _serve(servicer: FakeRagService) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_RagServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_retries_unavailable_then_succeeds() -> None:
    async def run() -> int:
        servicer = FakeRagService(failures=2)
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
        servicer = FakeRagService(failures=10)
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
        server, target = await _serve(FakeRagService(failures=0, delay_s=2.0))
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
        server, target = await _serve(FakeRagService(failures=0, delay_s=0.01))
        try:
            async with RagClient(target) as client:
                return [e.WhichOneof("event") async for e in client.query("q")]
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == ["retrieval", "token", "token", "token", "final"]
