"""ragserve.client over real gRPC: retry on UNAVAILABLE (service config), default deadlines, streaming.

The servers here are in-process grpc.aio servers with fake servicers (named Fake*), so that the
failure patterns are exact; the client's behaviour against the real service is in tests/e2e.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
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


class FakeDeadlineRecordingService(FakeRagService):
    """Records the time each Retrieve call had left when it arrived (None: the caller set no deadline)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(failures=0, delay_s=delay_s)
        self.time_remaining: list[float | None] = []

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        self.time_remaining.append(context.time_remaining())
        return await super().Retrieve(request, context)


def test_default_deadline_applies() -> None:
    async def run() -> grpc.StatusCode:
        # Answers after 30 s: only a deadline (0.3 s) ends the call first.
        server, target = await _serve(FakeRagService(failures=0, delay_s=30.0))
        try:
            async with RagClient(target, default_timeout_s=0.3) as client:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await client.retrieve("q")
                return info.value.code()
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_default_deadline_is_the_one_the_server_sees() -> None:
    async def run() -> list[float | None]:
        servicer = FakeDeadlineRecordingService()
        server, target = await _serve(servicer)
        try:
            async with RagClient(target, default_timeout_s=20.0) as client:
                await client.retrieve("q")
        finally:
            await server.stop(None)
        return servicer.time_remaining

    (left,) = asyncio.run(run())
    # The 20 s set: gRPC sends it rounded up to its wire units, so the server may read a little more
    # than 20 s; the margins are far from no deadline at all or a 30 s one.
    assert left is not None and 10.0 < left <= 20.5


def test_query_is_an_async_iterator_of_events() -> None:
    async def run() -> list[str]:
        server, target = await _serve(FakeRagService(failures=0, delay_s=0.01))
        try:
            async with RagClient(target) as client:
                return [e.WhichOneof("event") async for e in client.query("q")]
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == ["retrieval", "token", "token", "token", "final"]


def test_a_filter_in_its_json_form_becomes_the_request_message() -> None:
    from ragserve.client import filter_message
    from ragserve.v1 import rag_pb2 as pb

    text = '{"must": [{"key": "lang", "match": {"value": "en"}}], "must_not": [{"key": "year", "range": {"lt": 2020}}]}'
    message = filter_message(text)
    assert isinstance(message, pb.Filter)
    assert message.must[0].key == "lang" and message.must[0].match.value.string_value == "en"
    assert message.must_not[0].range.lt.number_value == 2020
    assert filter_message(None) is None
    for bad in ('{"must": [{"key": "lang", "matches": {}}]}', "not json"):
        with pytest.raises(ValueError, match="filter"):
            filter_message(bad)
