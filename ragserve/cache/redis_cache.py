"""A Redis store shared by many sidecars, built so that Redis can never stall a request.

One long-lived blocking pool of pre-connected connections; connect and socket timeouts; a health
check on connections idle longer than `health_check_interval_s`; one immediate retry when a pooled
connection turns out stale (e.g. after a Redis restart). On top of that, every request-path call is
wrapped in `asyncio.timeout(timeout_s)`: a SIGSTOPped or CLIENT PAUSEd server accepts the TCP
connection and then never answers, and only an outer timeout bounds that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ragserve.cache.base import CacheBackendError
from ragserve.config import CacheSettings, default_of

T = TypeVar("T")

# Deleting a namespace is an operator action, not on the request path: it may take longer.
_ADMIN_TIMEOUT_S = 30.0
_SCAN_BATCH = 500


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        namespace: str = default_of(CacheSettings, "namespace"),
        timeout_s: float = default_of(CacheSettings, "redis_timeout_ms") / 1000.0,
        connect_timeout_s: float = default_of(CacheSettings, "redis_connect_timeout_ms") / 1000.0,
        pool_size: int = default_of(CacheSettings, "redis_pool_size"),
        health_check_interval_s: float = default_of(CacheSettings, "redis_health_check_interval_s"),
        warm_connections: int = 4,
    ) -> None:
        self.url = url
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._warm = max(1, min(warm_connections, pool_size))
        self._pool_kwargs = {
            "max_connections": pool_size,
            # Waiting for a free pooled connection is bounded by the request timeout too.
            "timeout": timeout_s,
            "socket_connect_timeout": connect_timeout_s,
            "socket_timeout": max(timeout_s, connect_timeout_s),
            "socket_keepalive": True,
            "health_check_interval": health_check_interval_s,
            # One retry, only on a connection error (a stale pooled connection); never on a timeout,
            # which would double the cost of a paused server.
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "retry_on_error": [RedisConnectionError],
            "client_name": "ragserve-cache",
        }
        self._client = aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(url, **self._pool_kwargs)
        )

    def _k(self, key: str) -> str:
        return f"{self.namespace}:{key}"

    async def _call(self, op: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s):
                return await op()
        except (TimeoutError, RedisTimeoutError) as exc:
            raise CacheBackendError(
                "timeout", f"redis did not answer within {timeout_s or self.timeout_s:.3f} s"
            ) from exc
        except (RedisConnectionError, OSError) as exc:
            raise CacheBackendError("connection", str(exc) or type(exc).__name__) from exc
        except RedisError as exc:
            raise CacheBackendError("protocol", str(exc) or type(exc).__name__) from exc

    async def get(self, key: str) -> bytes | None:
        value = await self._call(lambda: self._client.get(self._k(key)))
        if value is None or isinstance(value, bytes):
            return value
        raise CacheBackendError("protocol", f"unexpected GET reply type {type(value).__name__}")

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        await self._call(lambda: self._client.set(self._k(key), value, px=ttl_ms))

    async def ping(self) -> None:
        await self._call(self._client.ping)

    async def connect(self) -> None:
        """Open `warm_connections` pooled connections now, so the first requests do not pay for it."""
        timeout_s = self._connect_timeout_s + self.timeout_s
        await asyncio.gather(*(self._call(self._client.ping, timeout_s) for _ in range(self._warm)))

    async def flush(self) -> int:
        """Unlink this namespace's keys (SCAN, never FLUSHDB: the Redis may hold other data)."""
        admin = aioredis.Redis.from_url(
            self.url, socket_connect_timeout=2.0, socket_timeout=_ADMIN_TIMEOUT_S, client_name="ragserve-flush"
        )
        try:
            async with asyncio.timeout(_ADMIN_TIMEOUT_S):
                dropped = 0
                async for batch in _key_batches(admin, f"{self.namespace}:*"):
                    dropped += int(await admin.unlink(*batch))
                return dropped
        except (TimeoutError, RedisError, OSError) as exc:
            raise CacheBackendError("connection", f"flush failed: {exc}") from exc
        finally:
            await admin.aclose()

    async def close(self) -> None:
        await self._client.aclose()


async def _key_batches(client: aioredis.Redis, pattern: str) -> AsyncIterator[list[bytes]]:
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=_SCAN_BATCH):
        batch.append(key)
        if len(batch) >= _SCAN_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
