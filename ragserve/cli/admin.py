"""Operator commands: `cache-flush`."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ragserve.cli.app import app


@app.command("cache-flush")
def cache_flush(
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (RAGSERVE_CACHE_REDIS_URL)")] = None,
    namespace: Annotated[str | None, typer.Option(help="Key prefix (RAGSERVE_CACHE_NAMESPACE)")] = None,
) -> None:
    """Drop every retrieval and answer cache entry in the shared Redis cache (only this namespace)."""
    from ragserve.config import CacheSettings

    cfg = CacheSettings()
    if cfg.backend != "redis" and redis_url is None:
        typer.echo(
            f"the cache backend is {cfg.backend!r}: an in-process cache lives in the server and is emptied by "
            "restarting it; publishing a new index version also makes every older entry unreachable"
        )
        return
    from ragserve.cache.base import CacheBackendError
    from ragserve.cache.redis_cache import RedisStore

    store = RedisStore(redis_url or cfg.redis_url, namespace=namespace or cfg.namespace)

    async def run() -> int:
        try:
            return await store.flush()
        finally:
            await store.close()

    try:
        dropped = asyncio.run(run())
    except CacheBackendError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"dropped {dropped} cache entries from {store.url} (namespace {store.namespace!r})")
