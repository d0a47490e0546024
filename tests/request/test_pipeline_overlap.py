"""Query hands the prompt to the generator before the retrieval event is consumed (overlap)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ragserve.budget import Deadline, RequestContext
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.events import TokenDelta, Usage
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.types import GenerateParams, RetrievalResult, RetrieveParams
from tests.fakes import FakeGenerator


def test_generation_starts_before_the_retrieval_event_is_sent(
    sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    # One token after a pause; counts the streams started and those cancelled while pausing.
    fake = FakeGenerator(["ok"], delay_s=0.2, usage=Usage(10, 1, 0))
    params = RetrieveParams("Who discovered penicillin?", top_k=2, budget_ms=10_000)

    async def scenario() -> None:
        with ThreadPoolExecutor(2) as executor:
            pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), fake, executor)
            events = pipeline.query(params, GenerateParams(4, 0.0), RequestContext(Deadline(10_000), "r1"))
            first = await anext(events)
            assert isinstance(first, RetrievalResult)
            await asyncio.sleep(0.01)  # the consumer is still "sending" the retrieval event
            assert fake.calls == 1
            rest = [e async for e in events]
            assert isinstance(rest[0], TokenDelta) and rest[0].text == "ok"

            # A caller that goes away after the retrieval event: the engine request is cancelled.
            events = pipeline.query(params, GenerateParams(4, 0.0), RequestContext(Deadline(10_000), "r2"))
            await anext(events)
            await asyncio.sleep(0.01)
            await events.aclose()
            assert fake.calls == 2 and fake.cancelled == 1

    asyncio.run(scenario())
