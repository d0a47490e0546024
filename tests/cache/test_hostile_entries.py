"""Entries are not trusted as written: whoever can write to the store (a shared Redis) must not be
able to make a sidecar serve passages or answers it did not produce.

A refused entry is a miss, counted in ragserve_(answer_)cache_rejected_entries_total by reason;
never an error to the caller. Every case runs against the in-process LRU and a real redis-server,
on caches built by the factory from settings, as the server builds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from ragserve.cache.base import CachedAnswer, CachedRetrieval
from ragserve.cache.codec import encode_answer, encode_entry
from ragserve.cache.keys import answer_key, retrieval_key
from ragserve.cache.layer import StoreBackedAnswerCache, StoreBackedCache
from ragserve.config import CacheSettings
from ragserve.errors import ConfigError
from ragserve.events import Usage
from ragserve.factory import make_answer_cache, make_cache
from ragserve.metrics import ANSWER_CACHE_REJECTED, CACHE_ERRORS, CACHE_REJECTED, CACHE_REQUESTS
from ragserve.types import Chunk, Passage
from tests.cache.redis_proc import RedisProcess

HMAC_KEY = "a-test-key-of-32-bytes-0123456789"
TOP_K = 3


@pytest.fixture(params=["memory", "redis"])
def settings(request: pytest.FixtureRequest) -> Iterator[Callable[..., CacheSettings]]:
    """Cache settings for each backend (a fresh redis-server per test for "redis")."""
    if request.param == "memory":
        yield lambda **kw: CacheSettings(backend="memory", **kw)
        return
    server: RedisProcess = request.getfixturevalue("redis_server")
    # Unsigned entries allowed: the tests set a key where they mean one. A generous timeout: these
    # tests are about what is refused, and a 1 MiB GET on a loaded two-core host once took over 1 s.
    yield lambda **kw: CacheSettings(
        backend="redis", redis_url=server.url, redis_timeout_ms=10_000.0, **{"allow_unsigned": True, **kw}
    )


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def _passages(n: int, text: str = "text") -> tuple[Passage, ...]:
    return tuple(
        Passage(Chunk(f"doc{i}#0", f"doc{i}", f"{text} {i}", f"Title {i}", f"doc{i}.md", 0, 10), 0.9 - i / 10, i + 1)
        for i in range(n)
    )


def _key(query: str = "What is TCP?"):
    return retrieval_key(query, TOP_K, "1", ("e",))


def _entry(query: str = "What is TCP?", n: int = TOP_K, text: str = "text") -> CachedRetrieval:
    return CachedRetrieval(_passages(n, text), "1", ("tier1:20",), query)


def _retrieval_cache(settings: CacheSettings) -> StoreBackedCache:
    cache = make_cache(settings)
    assert isinstance(cache, StoreBackedCache)
    return cache


def _rejected(reason: str) -> float:
    return sum(CACHE_REJECTED.labels(b, reason)._value.get() for b in ("memory", "redis"))


def _errors(backend: str) -> float:
    """Store failures so far (any kind): a read that failed was never refused."""
    return sum(
        sample.value
        for metric in CACHE_ERRORS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("backend") == backend
    )


def _valid_row(**fields: object) -> bytes:
    data = orjson.loads(encode_entry(_entry()))
    return orjson.dumps({**data, **fields})


# A planted entry under the right key, each wrong in one way; all would have been served before.
PLANTED = {
    "more passages than top_k": (encode_entry(_entry(n=TOP_K + 5)), "out_of_bounds"),
    "another query's entry": (encode_entry(_entry(query="What is UDP?")), "query"),
    "ranks not 1..n": (
        _valid_row(p=[[*row[:8], 7, row[9]] for row in orjson.loads(encode_entry(_entry()))["p"]]),
        "out_of_bounds",
    ),
    "negative chunk offsets": (_valid_row(p=[["c", "d", "t", "n", "s", -5, 3, 0.5, 1, {}]]), "out_of_bounds"),
    "score a string": (_valid_row(p=[["c", "d", "t", "n", "s", 0, 3, "0.5", 1, {}]]), "malformed"),
    "metadata not fields of scalars": (
        _valid_row(p=[["c", "d", "t", "n", "s", 0, 3, 0.5, 1, {"f": {"x": 1}}]]),
        "malformed",
    ),
    "raw cosine a string": (_valid_row(p=[["c", "d", "t", "n", "s", 0, 3, 0.5, 1, {}, "0.7", None]]), "malformed"),
    "degraded not a bool": (_valid_row(d="yes"), "malformed"),
    "passages an object": (_valid_row(p={"a": 1}), "malformed"),
    "tiers not strings": (_valid_row(t=[1, 2]), "malformed"),
    "many tiers": (_valid_row(t=["x"] * 100), "out_of_bounds"),
    "another index version": (encode_entry(CachedRetrieval(_passages(3), "2", (), "What is TCP?")), "index_version"),
    # Larger than the 1 MiB default cap: refused before it is parsed.
    "too large": (encode_entry(_entry(text="x" * 400_000)), "too_large"),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_planted_retrieval_entry_is_refused_as_a_miss(settings, case: str) -> None:
    raw, reason = PLANTED[case]

    async def body() -> None:
        cache = _retrieval_cache(settings())
        key = _key()
        await cache.store.set(key.storage_key, raw, ttl_s=60)
        backend = cache.backend
        misses, before = CACHE_REQUESTS.labels(backend, "miss"), _rejected(reason)
        misses_before, errors_before = misses._value.get(), _errors(backend)
        assert await cache.get(key) is None
        assert _errors(backend) == errors_before, "the store failed the read; nothing was refused"
        assert _rejected(reason) == before + 1
        assert misses._value.get() == misses_before + 1  # a miss to the caller, not an error
        assert cache.breaker.allow()  # and not held against the backend
        await cache.close()

    run(body())


def test_entries_over_the_size_cap_are_never_written(settings) -> None:
    async def body() -> None:
        cache = _retrieval_cache(settings(max_entry_bytes=4096))
        big, small = _key("big"), _key("small")
        cache.put(big, _entry("big", text="x" * 5000))
        cache.put(small, _entry("small"))
        await cache.drain()
        assert await cache.store.get(big.storage_key) is None
        assert await cache.get(small) is not None
        await cache.close()

    run(body())


def test_with_a_key_only_entries_this_key_sealed_for_this_storage_key_are_served(settings) -> None:
    async def body() -> None:
        cache = _retrieval_cache(settings(hmac_key=HMAC_KEY))
        other_key_cache = _retrieval_cache(settings(hmac_key="another-key-also-long-enough-1234", namespace="x"))
        tcp, udp = _key("What is TCP?"), _key("What is UDP?")
        before = _rejected("unauthenticated")

        # What the cache writes itself is read back.
        cache.put(tcp, _entry("What is TCP?"))
        await cache.drain()
        assert (hit := await cache.get(tcp)) is not None and hit.entry == _entry("What is TCP?")
        sealed = await cache.store.get(tcp.storage_key)
        assert sealed is not None

        # Plain (unsigned) entries: planted by whoever reaches the store.
        await cache.store.set(udp.storage_key, encode_entry(_entry("What is UDP?")), ttl_s=60)
        assert await cache.get(udp) is None
        # A genuine sealed entry copied under another key: the MAC covers the storage key.
        forged = sealed.replace(b'"What is TCP?"', b'"What is UDP?"')
        await cache.store.set(udp.storage_key, sealed, ttl_s=60)
        assert await cache.get(udp) is None
        await cache.store.set(udp.storage_key, forged, ttl_s=60)
        assert await cache.get(udp) is None
        # Sealed with another key.
        other_key_cache.put(udp, _entry("What is UDP?"))
        await other_key_cache.drain()
        planted = await other_key_cache.store.get(udp.storage_key)
        assert planted is not None
        await cache.store.set(udp.storage_key, planted, ttl_s=60)
        assert await cache.get(udp) is None
        # A truncated MAC.
        await cache.store.set(udp.storage_key, b"h1:short", ttl_s=60)
        assert await cache.get(udp) is None

        assert _rejected("unauthenticated") == before + 5
        await cache.close()
        await other_key_cache.close()

    run(body())


def test_the_key_can_come_from_a_file(tmp_path, settings) -> None:
    key_file = tmp_path / "cache.key"
    key_file.write_text(HMAC_KEY + "\n")

    async def body() -> None:
        from_file = _retrieval_cache(settings(hmac_key_file=key_file))
        from_env = _retrieval_cache(settings(hmac_key=HMAC_KEY))
        key = _key()
        from_env.put(key, _entry())
        await from_env.drain()
        sealed = await from_env.store.get(key.storage_key)
        assert sealed is not None
        await from_file.store.set(key.storage_key, sealed, ttl_s=60)
        assert await from_file.get(key) is not None  # the same key, trailing newline dropped
        await from_file.close()
        await from_env.close()

    run(body())


def test_bad_key_settings_stop_start_up(tmp_path) -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        make_cache(CacheSettings(hmac_key="short"))
    with pytest.raises(ValidationError, match="not both"):
        CacheSettings(hmac_key=HMAC_KEY, hmac_key_file=tmp_path / "k")
    with pytest.raises(ConfigError, match="HMAC_KEY_FILE"):
        make_cache(CacheSettings(hmac_key_file=tmp_path / "missing"))


# --- the answer cache: the same rules ------------------------------------------------------------


def _answer(n: int = TOP_K, text: str = "An answer [1].") -> CachedAnswer:
    return CachedAnswer(text, _passages(n), "1", ("tier1:20",), Usage(300, 12, 256), "model-a", 120, 480)


def _answer_key(query: str = "What is TCP?"):
    return answer_key(_key(query), "model-a", "t", 160, 128)


def _answer_rejected(reason: str) -> float:
    return sum(ANSWER_CACHE_REJECTED.labels(b, reason)._value.get() for b in ("memory", "redis"))


def _answer_cache(settings: CacheSettings) -> StoreBackedAnswerCache:
    cache = make_answer_cache(settings)
    assert isinstance(cache, StoreBackedAnswerCache)
    return cache


def _answer_with(**fields: object) -> bytes:
    return orjson.dumps({**orjson.loads(encode_answer(_answer())), **fields})


PLANTED_ANSWERS = {
    "more passages than top_k": (encode_answer(_answer(n=TOP_K + 2)), "out_of_bounds"),
    "negative usage": (_answer_with(u=[-1, 12, 0, 0, 0]), "out_of_bounds"),
    "text over the answer cap": (encode_answer(_answer(text="x" * 70_000)), "out_of_bounds"),
    "too large": (encode_answer(_answer(text="x" * 1_100_000)), "too_large"),
}


@pytest.mark.parametrize("case", list(PLANTED_ANSWERS))
def test_a_planted_answer_is_refused_as_a_miss(settings, case: str) -> None:
    raw, reason = PLANTED_ANSWERS[case]

    async def body() -> None:
        answers = _answer_cache(settings())
        key = _answer_key()
        await answers.store.set(key.storage_key, raw, ttl_s=60)
        before = _answer_rejected(reason)
        assert await answers.get(key) is None
        assert _answer_rejected(reason) == before + 1
        await answers.close()

    run(body())


def test_with_a_key_an_unsigned_answer_is_refused(settings) -> None:
    async def body() -> None:
        answers = _answer_cache(settings(hmac_key=HMAC_KEY))
        tcp, udp = _answer_key("What is TCP?"), _answer_key("What is UDP?")
        answers.put(tcp, _answer())
        await answers.drain()
        assert await answers.get(tcp) == _answer()
        before = _answer_rejected("unauthenticated")
        await answers.store.set(udp.storage_key, encode_answer(_answer(text="Planted.")), ttl_s=60)
        assert await answers.get(udp) is None
        sealed = await answers.store.get(tcp.storage_key)
        assert sealed is not None
        await answers.store.set(udp.storage_key, sealed, ttl_s=60)  # another question's answer
        assert await answers.get(udp) is None
        assert _answer_rejected("unauthenticated") == before + 2
        await answers.close()

    run(body())


def test_a_passages_raw_scores_survive_the_cache_and_older_entries_still_read() -> None:
    """The decline reads each passage's raw cosine and BM25 score, so a cache hit keeps them; an
    entry written before they were kept (10 fields a passage) reads with none."""
    import dataclasses

    from ragserve.cache.codec import decode_entry

    passages = tuple(dataclasses.replace(p, dense=0.5 + i / 10, lexical=None) for i, p in enumerate(_passages(2)))
    back = decode_entry(encode_entry(CachedRetrieval(passages, "1", (), "q")))
    assert [(p.dense, p.lexical) for p in back.passages] == [(0.5, None), (0.6, None)]
    data = orjson.loads(encode_entry(CachedRetrieval(passages, "1", (), "q")))
    data["p"] = [row[:10] for row in data["p"]]
    assert all(p.dense is None for p in decode_entry(orjson.dumps(data)).passages)
