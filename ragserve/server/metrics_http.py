"""Prometheus /metrics over HTTP on the server's event loop: bounded connections, no thread per connection.

prometheus_client's own server starts a thread for every connection and keeps an idle one open
forever. Here a connection costs a socket and a coroutine, at most `max_connections` are open (a new
one replaces the oldest that has not finished sending its request, so idle sockets cannot lock a
scrape out), each gets `timeout_s` from accept to the last byte of its answer, and the exposition
text is rendered on one thread of its own (concurrent scrapes share one rendering).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

# A scrape's request head is a few hundred bytes; anything longer is not Prometheus.
_MAX_REQUEST_HEAD = 8192
_METRICS_PATHS = ("/metrics", "/")

Encoder = Callable[[CollectorRegistry], bytes]


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        max_connections: int,
        timeout_s: float,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._registry = registry
        self._render_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-render")
        self._rendering: dict[str, asyncio.Future[bytes]] = {}
        # Open connections, oldest first; the ones still reading their request may be replaced.
        self._open: dict[asyncio.StreamWriter, bool] = {}
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0). OSError when the address is taken."""
        self._server = await asyncio.start_server(
            self._serve, self._host, self._port, limit=_MAX_REQUEST_HEAD, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        self._render_thread.shutdown(wait=False, cancel_futures=True)

    def _make_room(self) -> bool:
        """At the bound, drop the oldest connection still sending its request; False if none is."""
        if len(self._open) < self._max_connections:
            return True
        oldest_reading = next((w for w, answering in self._open.items() if not answering), None)
        if oldest_reading is None:
            return False
        oldest_reading.transport.abort()
        del self._open[oldest_reading]
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            writer.transport.abort()
            return
        self._open[writer] = False
        try:
            async with asyncio.timeout(self._timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
                if writer not in self._open:
                    return  # replaced while reading
                self._open[writer] = True
                writer.write(await self._answer(head))
                await writer.drain()
                writer.close()
                await writer.wait_closed()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # slow, idle, oversized or gone: the socket is closed below
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()

    async def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return _response(400, "text/plain", b"bad request\n")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return _response(405, "text/plain", b"only GET\n")
        if target.split("?", 1)[0] not in _METRICS_PATHS:
            return _response(404, "text/plain", b"not found: metrics are at /metrics\n")
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        body = await self._render(encoder, content_type)
        return _response(200, content_type, b"" if method == "HEAD" else body, len(body))

    async def _render(self, encoder: Encoder, content_type: str) -> bytes:
        pending = self._rendering.get(content_type)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = loop.run_in_executor(self._render_thread, encoder, self._registry)
            self._rendering[content_type] = pending
            pending.add_done_callback(lambda _: self._rendering.pop(content_type, None))
        # Shielded: one scraper giving up must not cancel the rendering others wait for.
        return await asyncio.shield(pending)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(status: int, content_type: str, body: bytes, length: int | None = None) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
