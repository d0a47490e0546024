from __future__ import annotations

import redis
from typer.testing import CliRunner

from ragserve.cli import app
from tests.cache.redis_proc import RedisProcess
from tests.helpers import free_port


def test_cache_flush_drops_only_the_namespace(redis_server: RedisProcess, monkeypatch) -> None:
    client = redis.Redis(port=redis_server.port)
    for i in range(3):
        client.set(f"ragserve:r1:1:abc:{i}", b"v")
    client.set("other:key", b"keep")
    monkeypatch.setenv("RAGSERVE_CACHE_BACKEND", "redis")
    monkeypatch.setenv("RAGSERVE_CACHE_REDIS_URL", redis_server.url)
    result = CliRunner().invoke(app, ["cache-flush"])
    assert result.exit_code == 0, result.output
    assert "dropped 3 cache entries" in result.output
    assert client.keys("ragserve:*") == []
    assert client.get("other:key") == b"keep"
    client.close()


def test_cache_flush_reports_an_unreachable_redis() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(app, ["cache-flush", "--redis-url", url])
    assert result.exit_code == 1
    assert "error:" in result.output and "flush failed" in result.output


def test_cache_flush_with_the_memory_backend_explains(monkeypatch) -> None:
    monkeypatch.setenv("RAGSERVE_CACHE_BACKEND", "memory")
    result = CliRunner().invoke(app, ["cache-flush"])
    assert result.exit_code == 0 and "in-process" in result.output
