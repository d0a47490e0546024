from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ragserve.cache.base import CacheStore
from ragserve.cache.memory import MemoryStore
from ragserve.cache.redis_cache import RedisStore
from tests.cache.redis_proc import RedisProcess


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A fresh redis-server per test, stopped afterwards whatever the test did to it."""
    server = RedisProcess(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Callable[[], CacheStore]:
    """Each contract test runs against both stores: the in-process LRU and a real redis-server."""
    if request.param == "memory":
        return lambda: MemoryStore(max_entries=100)
    server: RedisProcess = request.getfixturevalue("redis_server")
    # Generous timeout: these tests check behaviour, not speed, on a shared machine.
    return lambda: RedisStore(server.url, namespace="t", timeout_s=1.0)
