"""The answer cache: replayed without the engine, stored only for clean temperature-0 answers, keyed
by everything that changes the text, and never a reason for a request to fail.

The pipeline runs with the real MiniLM embedder and HNSW index; the generator is a fake (named as
such) that counts how often it is asked. Store contracts run against the LRU and a real Redis.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from indexer.build import build_index
from ragserve.budget import Deadline, RequestContext
from ragserve.cache.base import CachedAnswer, CachedRetrieval, CacheStore
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.codec import encode_answer, encode_entry
from ragserve.cache.keys import KEY_SCHEMA, AnswerKey, answer_key, retrieval_key
from ragserve.cache.layer import MAX_ANSWER_BYTES, StoreBackedAnswerCache
from ragserve.cache.memory import MemoryStore
from ragserve.cache.redis_cache import RedisStore
from ragserve.config import CacheSettings
from ragserve.errors import DeadlineExpired
from ragserve.events import FinalSummary, GenerationChunk, QueryEvent, TokenDelta, Usage
from ragserve.factory import assemble_pipeline, make_answer_cache
from ragserve.index.hnsw import HnswIndex
from ragserve.metrics import (
    ANSWER_CACHE_CIRCUIT_OPEN,
    ANSWER_CACHE_ERRORS,
    ANSWER_CACHE_REJECTED,
    ANSWER_CACHE_REQUESTS,
)
from ragserve.prompt import Prompt, prompt_template_id
from ragserve.request.caches import replay
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import AnswerPolicy
from ragserve.types import Chunk, Degraded, GenerateParams, Passage, RetrievalResult, RetrieveParams, StageTimings
from tests.cache.redis_proc import RedisProcess
from tests.conftest import SAMPLE_DOCS
from tests.fakes import FakeFlakyStore, FakeGenerator, FakeGeneratorBase

Q = "What does the TCP three-way handshake exchange between client and server?"
BUDGET_MS = 10_000  # generous: a retrieval cut short by the budget is (rightly) never stored


# The fake engine's fixed answer, with usage numbers of its own so a replay is recognizable.
ANSWER_WORDS = ("The handshake ", "exchanges ", "SYN, SYN-ACK ", "and ACK [1]. ✓")
ANSWER_USAGE = Usage(321, len(ANSWER_WORDS), 256)


def scripted_generator(**settings: Any) -> FakeGenerator:
    """The generator fake streaming ANSWER_WORDS; `settings` as FakeGenerator takes them."""
    return FakeGenerator(ANSWER_WORDS, usage=ANSWER_USAGE, **settings)


class FakeRefusingGenerator(FakeGeneratorBase):
    """Same model id as the generator fake, but fails the test if the engine is asked at all."""

    def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        raise AssertionError("the engine was asked for an answer the cache holds")


@pytest.fixture
def executor():
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def _pipeline(embedder, index_root: Path, executor, answers, generator=None) -> RagPipeline:
    generator = generator or scripted_generator()
    return assemble_pipeline(embedder, HnswIndex.load(index_root), generator, executor, answers=answers)


async def _ask(
    pipeline: RagPipeline,
    question: str = Q,
    temperature: float = 0.0,
    max_tokens: int = 16,
    budget_ms: int = BUDGET_MS,
    client_timeout_s: float | None = None,
) -> list[QueryEvent]:
    params = RetrieveParams(question, 3, budget_ms)
    gen = GenerateParams(max_tokens, temperature)
    events = [e async for e in pipeline.query(params, gen, RequestContext(Deadline(budget_ms, client_timeout_s), "r"))]
    if pipeline.caches.answers is not None:
        await pipeline.caches.answers.drain()  # type: ignore[attr-defined]
    return events


def _text(events: list[QueryEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenDelta))


def _final(events: list[QueryEvent]) -> FinalSummary:
    assert isinstance(events[-1], FinalSummary)
    return events[-1]


def _retrieval(events: list[QueryEvent]) -> RetrievalResult:
    assert isinstance(events[0], RetrievalResult)
    return events[0]


# --- through the pipeline -------------------------------------------------------------------------


def test_a_repeat_is_replayed_without_the_engine(embedder, sample_index, executor) -> None:
    store = MemoryStore()
    pipeline = _pipeline(embedder, sample_index, executor, StoreBackedAnswerCache(store))
    hits, stored = ANSWER_CACHE_REQUESTS.labels("memory", "hit"), ANSWER_CACHE_REQUESTS.labels("memory", "stored")

    async def body() -> tuple[list[QueryEvent], list[QueryEvent]]:
        before_stored = stored._value.get()
        first = await _ask(pipeline)
        assert stored._value.get() == before_stored + 1 and len(store) == 1
        pipeline.generator = FakeRefusingGenerator()  # same model id: the key still matches
        before_hits = hits._value.get()
        again = await _ask(pipeline, f"  {Q.replace(' ', '  ')}\n")  # the same question, normalized
        assert hits._value.get() == before_hits + 1
        return first, again

    first, again = asyncio.run(body())
    miss, hit = _final(first), _final(again)
    assert not miss.answer_cache_hit and miss.timings.answer_cache_ms > 0
    assert hit.answer_cache_hit and hit.finish_reason == "stop" and hit.generator_model == "fake-generator"
    assert _text(again) == _text(first) == "The handshake exchanges SYN, SYN-ACK and ACK [1]. ✓"
    assert sum(isinstance(e, TokenDelta) for e in again) == 1  # one event for a short answer
    # The original run's usage and context; this request's timings.
    assert hit.usage == miss.usage == Usage(321, 4, 256)
    assert (hit.context_tokens, hit.context_tokens_full) == (miss.context_tokens, miss.context_tokens_full)
    assert hit.timings.answer_cache_ms > 0 and hit.timings.prompt_ms == 0 and hit.timings.generation_ms == 0
    assert 0 < hit.timings.ttft_ms <= hit.timings.total_ms
    retrieval = _retrieval(again)
    assert retrieval.cache_hit and not retrieval.degraded.is_degraded()
    assert retrieval.passages == _retrieval(first).passages  # the passages the answer cites
    assert retrieval.timings.retrieval_total_ms > 0  # fresh, not the stored run's


def _consume_until(stop_after_tokens: int) -> Callable[[RagPipeline], Awaitable[None]]:
    async def run(pipeline: RagPipeline) -> None:
        stream = pipeline.query(
            RetrieveParams(Q, 3, BUDGET_MS), GenerateParams(16, 0.0), RequestContext(Deadline(BUDGET_MS), "r")
        )
        tokens = 0
        async for event in stream:
            tokens += isinstance(event, TokenDelta)
            if tokens == stop_after_tokens:
                break
        await stream.aclose()  # what a cancelled gRPC call does to the pipeline's generator

    return run


async def _expect(exc: type[Exception], pipeline: RagPipeline, **kwargs: object) -> None:
    with pytest.raises(exc):
        await _ask(pipeline, **kwargs)  # type: ignore[arg-type]


# case -> (the generator fake's settings, how the request runs); none of these may be stored.
NOT_STORED: dict[str, tuple[dict[str, Any], Callable[[RagPipeline], Awaitable[object]]]] = {
    "temperature above 0": ({}, lambda p: _ask(p, temperature=0.7)),
    "cut at max_tokens": ({"finish_reason": "length"}, _ask),
    "engine failure": ({"fail_after": 2}, lambda p: _expect(RuntimeError, p)),
    "cancelled mid-stream": ({}, _consume_until(2)),
    # Retrieval takes well under the 2 s; the four words would take 4 s.
    "client deadline": ({"delay_s": 1.0}, lambda p: _expect(DeadlineExpired, p, client_timeout_s=2.0)),
    "degraded retrieval": ({}, lambda p: _ask(p, budget_ms=0)),
}


# The client-deadline case waits out its 2 s deadline: slow (CI runs it).
CASES = [pytest.param(c, marks=pytest.mark.slow) if c == "client deadline" else c for c in NOT_STORED]


@pytest.mark.parametrize("case", CASES)
def test_only_clean_temperature_0_answers_are_stored(case: str, embedder, sample_index, executor) -> None:
    settings, run = NOT_STORED[case]
    generator = scripted_generator(**settings)
    store = MemoryStore()
    answers = StoreBackedAnswerCache(store)
    pipeline = _pipeline(embedder, sample_index, executor, answers, generator)

    async def body() -> None:
        await run(pipeline)
        await answers.drain()

    asyncio.run(body())
    assert generator.calls == 1  # the engine was asked (so the case ran as meant) ...
    assert len(store) == 0  # ... and nothing was stored


def test_a_new_index_version_misses(embedder, sample_index, executor, tmp_path) -> None:
    root = tmp_path / "index"
    shutil.copytree(sample_index, root, symlinks=True)
    generator = scripted_generator()
    pipeline = _pipeline(embedder, root, executor, StoreBackedAnswerCache(MemoryStore()), generator)

    async def asked_twice() -> tuple[list[QueryEvent], list[QueryEvent]]:
        return await _ask(pipeline), await _ask(pipeline)

    v1_miss, v1_hit = asyncio.run(asked_twice())
    assert not _final(v1_miss).answer_cache_hit and _final(v1_hit).answer_cache_hit and generator.calls == 1

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE_DOCS, docs)
    (docs / "new-doc.md").write_text("# A new document\n\nPublished after the first index version.\n")
    report = build_index(docs, root, embedder, progress=False)
    assert report.published
    pipeline.swap_index(HnswIndex.load(root))  # what a reload does

    v2_miss, v2_hit = asyncio.run(asked_twice())
    assert _retrieval(v2_miss).index_version == str(report.version) != _retrieval(v1_hit).index_version
    assert not _final(v2_miss).answer_cache_hit and generator.calls == 2
    assert _final(v2_hit).answer_cache_hit and _retrieval(v2_hit).index_version == str(report.version)


def test_a_failing_store_is_a_miss_and_the_engine_answers(embedder, sample_index, executor) -> None:
    store = FakeFlakyStore()
    answers = StoreBackedAnswerCache(store, breaker=CircuitBreaker(3, cooldown_s=60.0))
    generator = scripted_generator()
    pipeline = _pipeline(embedder, sample_index, executor, answers, generator)
    errors = ANSWER_CACHE_ERRORS.labels("fake", "connection")
    skipped = ANSWER_CACHE_REQUESTS.labels("fake", "skipped")

    async def body() -> list[list[QueryEvent]]:
        await answers.start()
        store.down = True
        return [await _ask(pipeline) for _ in range(5)]

    before_errors, before_skipped = errors._value.get(), skipped._value.get()
    runs = asyncio.run(body())
    assert generator.calls == 5
    assert all(_text(r) and not _final(r).answer_cache_hit and _final(r).finish_reason == "stop" for r in runs)
    # 3 failed lookups open the breaker (the stores after them are failures too, or skipped);
    # the next lookups do not touch the store.
    assert answers.breaker.state is BreakerState.OPEN
    assert ANSWER_CACHE_CIRCUIT_OPEN.labels("fake")._value.get() == 1
    assert errors._value.get() - before_errors == 3
    assert skipped._value.get() - before_skipped == 3


class FakeExplodingAnswerCache:
    """An answer cache that breaks its own contract and raises: the request must not care."""

    backend = "fake"

    async def get(self, key: AnswerKey, timeout_s: float | None = None) -> CachedAnswer | None:
        raise RuntimeError("boom")

    def put(self, key: AnswerKey, entry: CachedAnswer) -> None:
        raise RuntimeError("boom")

    async def start(self) -> None: ...

    async def flush(self) -> int:
        return 0

    async def close(self) -> None: ...

    async def drain(self) -> None: ...


def test_a_raising_answer_cache_never_fails_the_request(embedder, sample_index, executor) -> None:
    pipeline = _pipeline(embedder, sample_index, executor, FakeExplodingAnswerCache())
    events = asyncio.run(_ask(pipeline))
    assert _text(events) and not _final(events).answer_cache_hit


def test_a_paused_redis_costs_at_most_its_timeout(embedder, sample_index, executor, redis_server) -> None:
    # The socket timeout is the larger of the two (30 s): only the store's own 20 ms timeout ends
    # a lookup to a paused Redis, so a lookup without it would wait 30 s.
    answers = StoreBackedAnswerCache(
        RedisStore(redis_server.url, namespace="paused", timeout_s=0.02, connect_timeout_s=30.0),
        breaker=CircuitBreaker(3, cooldown_s=60.0),
    )
    generator = scripted_generator()
    pipeline = _pipeline(embedder, sample_index, executor, answers, generator)
    timeouts = ANSWER_CACHE_ERRORS.labels("redis", "timeout")
    skipped = ANSWER_CACHE_REQUESTS.labels("redis", "skipped")

    async def body() -> tuple[list[list[QueryEvent]], float, float]:
        await answers.start()
        assert not _final(await _ask(pipeline)).answer_cache_hit
        assert _final(await _ask(pipeline)).answer_cache_hit
        timeouts_before = timeouts._value.get()
        redis_server.pause()
        try:
            paused = [await _ask(pipeline) for _ in range(4)]
            skipped_before = skipped._value.get()
            paused.append(await _ask(pipeline))
            return paused, timeouts._value.get() - timeouts_before, skipped._value.get() - skipped_before
        finally:
            redis_server.resume()
            await answers.close()

    paused, timed_out, last_skipped = asyncio.run(body())
    assert generator.calls == 1 + 5
    assert all(_text(r) and not _final(r).answer_cache_hit for r in paused)
    assert timed_out >= 3  # the store's timeout ended the calls that reached Redis, and opened the breaker
    assert answers.breaker.state is not BreakerState.CLOSED
    assert last_skipped == 1  # the breaker is open: Redis not asked
    # Far above 20 ms, far below the 30 s of a lookup that waited for the socket.
    assert max(_final(r).timings.answer_cache_ms for r in paused) < 10_000


def test_dedupe_and_generation_settings_are_in_the_pipeline_key(embedder, sample_index, executor) -> None:
    answers = StoreBackedAnswerCache(MemoryStore())
    pipeline = _pipeline(embedder, sample_index, executor, answers)
    result = RetrievalResult([], StageTimings(), Degraded(), "7")

    def key(
        dedupe: bool = False, top_k: int = 3, max_tokens: int = 16, budget: int = 0, on: RagPipeline = pipeline
    ) -> str:
        params = RetrieveParams(Q, top_k, BUDGET_MS, dedupe)
        retrieval_key = on.caches.key_for(params, result.index_version, result.index_identity)
        answer_key = on.caches.answer_key(retrieval_key, GenerateParams(max_tokens, 0.0, budget))
        assert answer_key is not None
        return answer_key.storage_key

    base = key()
    assert base.startswith(f"a{KEY_SCHEMA}:7:")
    assert len({base, key(dedupe=True), key(top_k=4), key(max_tokens=17), key(budget=160)}) == 5
    naive = assemble_pipeline(
        embedder,
        pipeline.index,
        scripted_generator(),
        executor,
        answers=answers,
        policy=AnswerPolicy(prompt_layout="naive"),
    )
    assert key(on=naive) != base
    # Only greedy answers are reproducible: any other temperature has no key at all.
    greedy_key = pipeline.caches.key_for(RetrieveParams(Q, 3, BUDGET_MS), "7", "")
    assert pipeline.caches.answer_key(greedy_key, GenerateParams(16, 0.7)) is None


# --- keys and entries -----------------------------------------------------------------------------


def test_every_part_of_an_answer_key_matters(monkeypatch: pytest.MonkeyPatch) -> None:
    def key(
        query: str = "What is TCP?",
        top_k: int = 3,
        version: str = "1",
        embedder: str = "e",
        settings: tuple[str, ...] = ("ef=64",),
        model: str = "m",
        template: str = "t",
        budget: int = 160,
        max_tokens: int = 128,
    ) -> str:
        retrieval = retrieval_key(query, top_k, version, (embedder,), settings)
        return answer_key(retrieval, model, template, budget, max_tokens).storage_key

    base = key()
    assert key(query=" What  is\tTCP? ") == base
    others = [
        key(query="what is tcp?"),
        key(top_k=4),
        key(version="2"),
        key(embedder="e2"),
        key(settings=("ef=128",)),
        key(settings=("ef=64", "tier1 reranker")),
        key(model="m2"),
        key(template="t2"),
        key(budget=0),
        key(max_tokens=64),
    ]
    assert len({base, *others}) == len(others) + 1
    # Its own prefix: never the storage key of the passage list it was built on.
    retrieval = retrieval_key("What is TCP?", 3, "1", ("e",), ("ef=64",))
    assert base.startswith(f"a{KEY_SCHEMA}:1:") and retrieval.storage_key.startswith(f"r{KEY_SCHEMA}:1:")
    # The template id follows the system text and the layout.
    assert prompt_template_id("stable") != prompt_template_id("naive")
    monkeypatch.setattr("ragserve.prompt.SYSTEM_PREFIX", "Another system prompt.")
    assert prompt_template_id.__wrapped__("stable") != prompt_template_id("stable")


def _answer(text: str = "An answer [1]. é ✓", version: str = "1") -> CachedAnswer:
    passages = tuple(
        Passage(Chunk(f"doc{i}#0", f"doc{i}", f"text {i} é ✓", f"Title {i}", f"doc{i}.md", 0, 10), 0.9 - i / 10, i + 1)
        for i in range(3)
    )
    return CachedAnswer(text, passages, version, ("tier1:20",), Usage(300, 12, 256), "model-a", 120, 480)


def _key(query: str = "What is TCP?", version: str = "1") -> AnswerKey:
    return answer_key(retrieval_key(query, 3, version, ("e",)), "model-a", "t", 160, 128)


def _valid() -> dict[str, object]:
    return orjson.loads(encode_answer(_answer()))


def _with(**fields: object) -> bytes:
    return orjson.dumps({**_valid(), **fields})


MALFORMED = {
    "not json": b"\x00not json",
    "a passage list": encode_entry(CachedRetrieval((), "1")),
    "old schema": _with(s=0),
    "text not a string": _with(a=42),
    "usage too short": _with(u=[1, 2]),
    "usage not ints": _with(u=[1, "2", 3]),
    "a bool as a count": _with(c=[True, 3]),
    "passage row short": _with(p=[["c", "d", "t"]]),
    "passage id not a string": _with(p=[[1, "d", "t", "n", "s", 0, 1, 0.5, 1]]),
    "tiers not strings": _with(t=[1]),
    "missing model": orjson.dumps({k: v for k, v in _valid().items() if k != "m"}),
    "not an object": orjson.dumps([1, 2, 3]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_entry_is_a_miss_counted_as_rejected(case: str) -> None:
    store = MemoryStore()
    answers = StoreBackedAnswerCache(store)
    decode_errors = ANSWER_CACHE_REJECTED.labels("memory", "malformed")

    async def body() -> None:
        key = _key()
        await store.set(key.storage_key, MALFORMED[case], ttl_s=60)
        before = decode_errors._value.get()
        assert await answers.get(key) is None
        assert decode_errors._value.get() == before + 1
        assert answers.breaker.allow()  # a bad entry says nothing about the backend's health
        await answers.close()

    asyncio.run(body())


def test_an_entry_of_another_version_under_the_key_is_a_miss() -> None:
    store = MemoryStore()
    answers = StoreBackedAnswerCache(store)

    async def body() -> None:
        key = _key(version="2")
        await store.set(key.storage_key, encode_answer(_answer(version="1")), ttl_s=60)  # a mangled key
        assert await answers.get(key) is None
        await answers.close()

    asyncio.run(body())


def test_oversized_and_empty_answers_are_not_stored() -> None:
    store = MemoryStore()
    answers = StoreBackedAnswerCache(store)
    too_large = ANSWER_CACHE_ERRORS.labels("memory", "too_large")

    async def body() -> None:
        before = too_large._value.get()
        answers.put(_key("big"), _answer("é" * (MAX_ANSWER_BYTES // 2 + 1)))  # 2 bytes a character
        answers.put(_key("empty"), _answer(""))
        answers.put(_key("at the cap"), _answer("x" * MAX_ANSWER_BYTES))
        await answers.drain()
        assert too_large._value.get() == before + 1
        assert await answers.get(_key("big")) is None and await answers.get(_key("empty")) is None
        assert await answers.get(_key("at the cap")) is not None
        await answers.close()

    asyncio.run(body())


def test_long_answers_replay_in_a_few_events() -> None:
    entry = _answer("y" * 10_000)
    events = list(replay(entry, StageTimings(), lambda: 0.0, "identity"))
    tokens = [e for e in events if isinstance(e, TokenDelta)]
    assert 1 < len(tokens) <= 4 and "".join(t.text for t in tokens) == entry.text


# --- both stores ----------------------------------------------------------------------------------


def test_answer_round_trip_on_both_stores(make_store: Callable[[], CacheStore]) -> None:
    async def body() -> None:
        store = make_store()
        answers = StoreBackedAnswerCache(store, ttl_s=60)
        await answers.start()
        stored = ANSWER_CACHE_REQUESTS.labels(store.name, "stored")
        key = _key()
        assert await answers.get(key) is None
        before = stored._value.get()
        answers.put(key, _answer())
        await answers.drain()
        assert stored._value.get() == before + 1
        assert await answers.get(key) == _answer()
        assert await answers.get(_key(" What is  TCP?")) == _answer()  # normalized
        for other in (
            _key("What is UDP?"),
            _key(version="2"),
            answer_key(retrieval_key("What is TCP?", 3, "1", ("e",)), "model-b", "t", 160, 128),
            answer_key(retrieval_key("What is TCP?", 3, "1", ("e",)), "model-a", "t", 160, 64),
        ):
            assert await answers.get(other) is None
        # A passage list under the retrieval key of the same question is never read as an answer.
        assert await store.get(retrieval_key("What is TCP?", 3, "1", ("e",)).storage_key) is None
        await store.set(key.storage_key, b"{broken", ttl_s=60)
        assert await answers.get(key) is None and answers.breaker.allow()
        assert await answers.flush() == 1
        await answers.close()

    asyncio.run(body())


def test_answers_carry_their_ttl_in_redis(redis_server: RedisProcess) -> None:
    async def body() -> str:
        answers = StoreBackedAnswerCache(RedisStore(redis_server.url, namespace="ns", timeout_s=1.0), ttl_s=30)
        key = _key()
        answers.put(key, _answer())
        await answers.close()  # drains the write
        return key.storage_key

    storage_key = asyncio.run(body())
    client = redis.Redis(port=redis_server.port)
    assert 0 < client.pttl(f"ns:{storage_key}") <= 30_000
    client.close()


def test_factory_builds_the_answer_cache() -> None:
    assert make_answer_cache(CacheSettings(backend="off")) is None
    assert make_answer_cache(CacheSettings(answers=False)) is None
    memory = make_answer_cache(CacheSettings(backend="memory", answer_ttl_s=5))
    assert isinstance(memory, StoreBackedAnswerCache) and memory.backend == "memory" and memory.ttl_s == 5
    redis_cache = make_answer_cache(
        CacheSettings(backend="redis", redis_url="redis://127.0.0.1:1/0", allow_unsigned=True)
    )
    assert redis_cache is not None and redis_cache.backend == "redis"
    asyncio.run(redis_cache.close())
