"""The semantic layer under hostile input: a lookup's work is bounded and runs off the event loop,
and a query longer than the embedder's window is never matched on its shared prefix."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.cache import semantic
from ragserve.cache.keys import retrieval_key
from ragserve.cache.layer import StoreBackedCache
from ragserve.cache.memory import MemoryStore
from ragserve.cache.semantic import SemanticIndex
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.types import RetrievalResult, RetrieveParams

DIM = 8


def _unit(seed: int = 0) -> np.ndarray:
    vec = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return vec / np.linalg.norm(vec)


def _plant_variants(index: SemanticIndex, n: int, vector: np.ndarray) -> None:
    """n stored queries that embed exactly like the asked one, each refused by the guard (numbers)."""
    filler = "for an adult taking it every evening before sleep over several weeks " * 6
    for i in range(n):
        index.add(retrieval_key(f"is a dose of {i} mg of melatonin safe {filler}", 3, "1", ("e",)), vector)


ASKED = retrieval_key("is a dose of 5000 mg of melatonin safe for an adult?", 3, "1", ("e",))


def test_a_lookup_compares_a_bounded_number_of_1024_crafted_variants(monkeypatch) -> None:
    index = SemanticIndex(threshold=0.9, window=1024)
    vector = _unit()
    _plant_variants(index, 1024, vector)
    compared: list[str] = []
    real_guard = semantic.meaning_change

    def counting_guard(a: str, b: str) -> str:
        compared.append(b)
        return real_guard(a, b)

    monkeypatch.setattr(semantic, "meaning_change", counting_guard)
    match = index.lookup(ASKED, vector)
    assert match.key is None and match.rejected == "numbers"
    # Before the bound, every one of the 1,024 was compared (13.9 s with long crafted queries).
    assert 1 <= len(compared) <= 16


def test_a_semantic_lookup_does_not_hold_the_event_loop(monkeypatch) -> None:
    """The guard runs on a worker thread: a heartbeat coroutine keeps ticking while it works."""
    cache = StoreBackedCache(MemoryStore(), semantic=SemanticIndex(threshold=0.9, window=64))
    assert cache.semantic is not None
    vector = _unit()
    _plant_variants(cache.semantic, 64, vector)
    guard_threads: set[int] = set()
    real_guard = semantic.meaning_change

    def slow_guard(a: str, b: str) -> str:
        guard_threads.add(threading.get_ident())
        time.sleep(0.02)  # a slow comparison; sleeping, it would hold a loop thread but not the GIL
        return real_guard(a, b)

    monkeypatch.setattr(semantic, "meaning_change", slow_guard)

    async def body() -> tuple[int, int]:
        ticks = 0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.002)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)  # let the heartbeat start
        before = ticks
        assert await cache.get_similar(ASKED, vector) is None
        during = ticks - before
        stop.set()
        await beat
        await cache.close()
        return during, threading.get_ident()

    during, loop_thread = asyncio.run(body())
    assert guard_threads and loop_thread not in guard_threads
    # Bounded candidates x 20 ms of guard: the heartbeat (every 2 ms) ran many times meanwhile.
    # On the loop it could not have run once.
    assert during >= 3


# --- queries longer than the embedder's window -------------------------------------------------

# ~41 word pieces; eight of them exceed MiniLM's 256-token window, and both queries share all of it.
_PREFIX = (
    "in the water cycle the sun warms oceans and lakes so water rises as vapour, cools into clouds, "
    "falls again as rain or snow and flows back through rivers and the ground to the sea; "
) * 8
LONG_A = _PREFIX + "so what part do glaciers play in storing fresh water for centuries"
LONG_B = _PREFIX + "so what part does the wind play in carrying moisture over mountains"


def test_the_embedder_says_whether_a_query_fit_its_window(embedder: SentenceTransformerEmbedder) -> None:
    short = embedder.embed_query("What is the role of evaporation in the water cycle?")
    long = embedder.embed_query(LONG_A)
    assert short.fits_window and not long.fits_window
    np.testing.assert_allclose(
        short.vector, embedder.embed_queries(["What is the role of evaporation in the water cycle?"])[0], atol=1e-5
    )
    assert len(LONG_A) <= 2000  # an ordinary request: within the default max_query_chars


def test_long_queries_sharing_a_prefix_never_hit_semantically(embedder, sample_index: Path) -> None:
    va, vb = embedder.embed_queries([LONG_A, LONG_B])
    assert float(va @ vb) > 0.99  # the truncated vectors are the prefix's: a near-perfect cosine
    assert semantic.meaning_change(LONG_A, LONG_B) == ""  # and the guard sees no change in meaning
    cache = StoreBackedCache(MemoryStore(), semantic=SemanticIndex(threshold=0.95))
    executor = ThreadPoolExecutor(2)
    pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor, cache=cache)

    async def retrieve(query: str) -> RetrievalResult:
        result = await pipeline.retrieve(RetrieveParams(query, 3, 10_000), RequestContext(Deadline(10_000)))
        await cache.drain()
        return result

    async def body() -> tuple[RetrievalResult, RetrievalResult, RetrievalResult]:
        return await retrieve(LONG_A), await retrieve(LONG_B), await retrieve(LONG_A)

    try:
        first, other, again = asyncio.run(body())
    finally:
        executor.shutdown()
    assert not first.cache_hit
    assert not other.cache_hit  # before: served LONG_A's passages as a near-duplicate
    assert again.cache_hit  # the exact cache still serves a long query asked again


@pytest.mark.parametrize(("tokens", "fits"), [(12, True), (255, True), (256, False)])
def test_onnx_embedder_reports_the_window_from_its_own_tokenization(tokens: int, fits: bool) -> None:
    """The ONNX path counts the attention mask it builds anyway (an ONNX session fake stands in for
    the exported model, so no export is needed here)."""
    from ragserve.embed.onnx_backend import OnnxEmbedder

    class FakeTokenizer:
        pad_token_id = 0

        def __call__(self, texts: list[str], **kw: object) -> dict[str, np.ndarray]:
            assert kw["truncation"] is True and kw["max_length"] == 256
            n = min(tokens, 256)
            return {
                "input_ids": np.ones((len(texts), n), np.int64),
                "attention_mask": np.ones((len(texts), n), np.int64),
            }

    class FakeOnnxSession:
        def run(self, _outputs: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [np.ones((*feeds["input_ids"].shape, DIM), np.float32)]

    embedder = OnnxEmbedder.__new__(OnnxEmbedder)
    embedder._tokenizer = FakeTokenizer()
    embedder._session = FakeOnnxSession()
    embedder._inputs = {"input_ids", "attention_mask"}
    embedder._max_len = 256
    embedder._dim = DIM
    result = embedder.embed_query("a query")
    assert result.fits_window is fits
    assert result.vector.shape == (DIM,)
