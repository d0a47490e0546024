"""The shared fakes keep to the contracts the product code defines (the Protocols in ragserve)."""

from __future__ import annotations

import asyncio

import numpy as np

from ragserve.cache.base import CacheStore
from ragserve.embed.base import Embedder
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt
from ragserve.rerank.base import CrossEncoder
from ragserve.types import GenerateParams
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.fakes import (
    FakeClock,
    FakeCrossEncoder,
    FakeEmbedder,
    FakeEndlessGenerator,
    FakeFlakyStore,
    FakeGenerator,
    FakeRagService,
)


def test_each_fake_implements_its_protocol() -> None:
    assert isinstance(FakeGenerator(), Generator)
    assert isinstance(FakeEndlessGenerator(), Generator)
    assert isinstance(FakeEmbedder(), Embedder)
    assert isinstance(FakeCrossEncoder(), CrossEncoder)
    assert isinstance(FakeFlakyStore(), CacheStore)
    assert isinstance(FakeRagService(), pb_grpc.RagServiceServicer)


def test_fake_embedder_is_deterministic_and_normalized() -> None:
    embedder = FakeEmbedder(dim=8)
    vectors = embedder.embed_queries(["a", "b", "a"])
    assert vectors.shape == (3, 8) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.array_equal(vectors[0], vectors[2]) and not np.array_equal(vectors[0], vectors[1])
    query = embedder.embed_query("a")
    assert query.fits_window and np.array_equal(query.vector, vectors[0])
    constant = FakeEmbedder(dim=4, constant=True).embed_queries(["a", "b"])
    assert np.array_equal(constant[0], constant[1]) and np.isclose(np.linalg.norm(constant[0]), 1.0)


def test_fake_generator_streams_its_words_and_counts() -> None:
    fake = FakeGenerator(["a ", "b"], finish_reason="length")

    async def run() -> list[str]:
        return [c.text async for c in fake.stream(Prompt("s", "u"), GenerateParams(4, 0.0), "r")]

    assert asyncio.run(run()) == ["a ", "b"]
    assert fake.calls == 1 and fake.produced == 2 and fake.prompts[0].user == "u"


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock()
    assert clock() == 100.0
    clock.advance(0.5)
    assert clock() == 100.5
