"""End to end over a real gRPC channel with the real engine."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from tests.e2e.conftest import LiveServer


async def _timed_query(target: str, question: str, **kwargs: object) -> list[tuple[float, pb.QueryEvent]]:
    async with RagClient(target, default_timeout_s=120) as client:
        started = time.perf_counter()
        return [(time.perf_counter() - started, e) async for e in client.query(question, **kwargs)]  # type: ignore[arg-type]


def test_query_streams_retrieval_then_tokens_then_final(live_server: LiveServer) -> None:
    events = asyncio.run(
        _timed_query(live_server.target, "Explain how a Bloom filter answers membership queries.", max_tokens=40)
    )
    kinds = [e.WhichOneof("event") for _, e in events]
    assert kinds[0] == "retrieval"
    assert kinds[-1] == "final"
    assert set(kinds[1:-1]) == {"token"}
    token_times = [t for t, e in events if e.WhichOneof("event") == "token"]
    assert len(token_times) >= 5, kinds
    # Tokens arrive over time as the engine makes them, not in one burst at the end.
    assert token_times[-1] - token_times[0] > 0.1
    assert token_times[0] < events[-1][0]

    retrieval = events[0][1].retrieval
    assert retrieval.passages and retrieval.passages[0].doc_id == "bloom-filters.txt"
    first = retrieval.passages[0]
    assert first.chunk_id.startswith("bloom-filters.txt#") and first.text and first.score > 0
    assert retrieval.timings.embed_ms > 0

    final = events[-1][1].final
    assert final.usage.completion_tokens >= len(token_times)
    assert final.usage.prompt_tokens > 0
    assert final.timings.ttft_ms > 0 and final.timings.total_ms >= final.timings.ttft_ms
    answer = "".join(e.token.text for _, e in events if e.WhichOneof("event") == "token")
    assert answer.strip()


def test_prefix_cache_serves_the_template_prefix(live_server: LiveServer) -> None:
    async def finals() -> list[pb.FinalEvent]:
        out = []
        for question in (
            "What is the role of evaporation in the water cycle?",
            "What is the role of evaporation in the water cycle?",
            "What causes earthquakes at plate boundaries?",
        ):
            events = await _timed_query(live_server.target, question, max_tokens=8)
            out.append(events[-1][1].final)
        return out

    first, repeat, other = asyncio.run(finals())
    # A repeat reuses the whole prompt's KV blocks; a new question still reuses the fixed prefix.
    assert repeat.usage.prefix_cache_hit_tokens > first.usage.prefix_cache_hit_tokens
    assert repeat.timings.ttft_ms < first.timings.ttft_ms
    assert other.usage.prefix_cache_hit_tokens > 0
    assert first.usage.prefix_cache_hit_tokens > 0  # the template prefix was cached at warm-up


def test_retrieve_returns_passages_and_timings(live_server: LiveServer) -> None:
    async def call() -> pb.RetrieveResponse:
        async with RagClient(live_server.target) as client:
            return await client.retrieve("Who shared the Nobel Prize for penicillin?", top_k=3)

    response = asyncio.run(call())
    assert len(response.passages) == 3
    assert response.passages[0].doc_id == "discovery-of-penicillin.txt"
    assert [p.rank for p in response.passages] == [1, 2, 3]
    assert response.index_version == "1"
    assert response.timings.retrieval_total_ms > 0


def test_bad_input_is_invalid_argument_with_field(live_server: LiveServer) -> None:
    async def call() -> None:
        async with RagClient(live_server.target) as client:
            await client.retrieve("fine question", top_k=-3)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(call())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(info.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "top_k"


def test_expired_client_deadline_is_deadline_exceeded(live_server: LiveServer) -> None:
    async def call() -> None:
        async with RagClient(live_server.target) as client:
            async for _ in client.query("Describe the TLS 1.3 handshake in detail.", max_tokens=500, timeout_s=0.5):
                pass

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(call())
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_info_reports_what_is_served(live_server: LiveServer) -> None:
    async def call() -> pb.InfoResponse:
        async with RagClient(live_server.target) as client:
            return await client.info()

    info = asyncio.run(call())
    assert info.index_version == "1"
    assert info.index_chunks > 32
    assert info.embedder_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "SmolLM2" in info.generator_model
    assert info.retrieval_budget_ms == 70
