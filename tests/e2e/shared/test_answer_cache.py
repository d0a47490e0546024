"""A repeated temperature-0 question is answered from the answer cache, with the real engine behind it."""

from __future__ import annotations

import asyncio
import time

import pytest

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from tests.e2e.servers import LiveServer

pytestmark = pytest.mark.e2e

# No other test asks this (a shared server's answer cache outlives each test).
QUESTION = "What exit status does a container killed by the Linux OOM killer report, and why?"
# Room for the model to finish on its own: an answer cut at max_tokens is never stored.
MAX_TOKENS = 256


async def _ask(client: RagClient) -> tuple[float, list[pb.QueryEvent]]:
    """Client-side TTFT (request sent -> first token event) and the events."""
    started = time.perf_counter()
    ttft = 0.0
    events = []
    # A budget no loaded host runs out of: an answer over passages cut short by the budget is never stored.
    async for event in client.query(QUESTION, max_tokens=MAX_TOKENS, temperature=0.0, budget_ms=10_000):
        if not ttft and event.WhichOneof("event") == "token":
            ttft = time.perf_counter() - started
        events.append(event)
    return ttft, events


def test_a_repeated_answer_is_served_from_the_cache(live_server: LiveServer) -> None:
    async def body() -> list[tuple[float, list[pb.QueryEvent]]]:
        async with RagClient(live_server.target, default_timeout_s=120) as client:
            return [await _ask(client), await _ask(client)]

    (miss_ttft, miss), (hit_ttft, hit) = asyncio.run(body())
    first, again = miss[-1].final, hit[-1].final
    assert first.finish_reason == "stop", f"the engine's answer did not finish by itself: {first.finish_reason}"
    assert not first.answer_cache_hit and again.answer_cache_hit
    text = ["".join(e.token.text for e in events if e.WhichOneof("event") == "token") for events in (miss, hit)]
    assert text[0].strip() and text[1] == text[0]
    assert again.usage == first.usage  # the original run's
    assert hit[0].retrieval.cache_hit
    assert [p.chunk_id for p in hit[0].retrieval.passages] == [p.chunk_id for p in miss[0].retrieval.passages]
    # Generous bounds (a test, not a benchmark): no prefill, no decoding, on a shared 2-core host.
    assert hit_ttft < 1.0 and hit_ttft < miss_ttft, (hit_ttft, miss_ttft)
    assert again.timings.ttft_ms < 1000
