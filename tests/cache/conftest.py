from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
