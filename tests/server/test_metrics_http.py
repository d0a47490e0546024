"""The /metrics endpoint under hostile clients: idle and slow sockets, floods, odd requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import ragserve.metrics  # noqa: F401  (registers the ragserve_* series)
from ragserve.server.metrics_http import MetricsServer

# Generous: it only has to separate "closed by the timeout" from "kept open".
TIMEOUT_S = 1.0
NEVER_S = 20.0


@asynccontextmanager
async def metrics_server(max_connections: int = 16) -> AsyncIterator[tuple[MetricsServer, int]]:
    server = MetricsServer("127.0.0.1", 0, max_connections, TIMEOUT_S)
    port = await server.start()
    try:
        yield server, port
    finally:
        await server.close()


async def _get(port: int, request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    async with asyncio.timeout(NEVER_S):
        response = await reader.read()
    writer.close()
    return response


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_idle_sockets_take_no_threads_and_cannot_lock_out_a_scrape() -> None:
    async def body() -> None:
        threads_before = threading.active_count()
        async with metrics_server() as (server, port):
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
            # Half of them start a request and never finish it (slowloris).
            for _, writer in idle[::2]:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            await asyncio.sleep(0.2)
            response = await _get(port)
            assert response.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"ragserve_requests_total" in response
            # One rendering thread at most, not one per connection.
            assert threading.active_count() <= threads_before + 1
            assert server.open_connections <= 16
            async with asyncio.timeout(NEVER_S):
                closed = await asyncio.gather(*(_closed_by_server(reader) for reader, _ in idle))
            assert all(closed)
            assert server.open_connections == 0
            for _, writer in idle:
                writer.close()

    asyncio.run(body())


def test_odd_requests_get_plain_answers() -> None:
    async def body() -> None:
        async with metrics_server() as (_, port):
            assert (await _get(port, b"GET /admin HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
            assert (await _get(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
            assert (await _get(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
            too_long = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
            assert await _get(port, too_long) == b""
            head = await _get(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
            openmetrics = await _get(
                port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n"
            )
            assert b"application/openmetrics-text" in openmetrics and openmetrics.endswith(b"# EOF\n")

    asyncio.run(body())
