"""One vLLM OpenAI-compatible server, seen as a network peer that is not trusted.

Everything a server sends is bounded before it is kept: `/health` is judged by its status alone,
`/v1/models` and `/metrics` are read up to a cap and never decompressed, a streamed answer may send
no more events and characters than its `max_tokens` allows and may not go quiet for longer than the
stall limit, and every field is type-checked. Whatever a server does wrong is a `ServerFailed`: the
pool (`generate/remote.py`) counts it against that server and asks the next one.

Two connection pools per server: one for requests (as many connections as calls may stream, so a
call never waits for one), one small one for probes, `/metrics` and warming, so a probe never
queues behind streaming calls and a busy server is never taken for a dead one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from ragserve.errors import ConfigError, Overloaded
from ragserve.generate.vllm_wire import (
    METRICS_MAX_BYTES,
    MODELS_MAX_BYTES,
    ServedModel,
    ServerFailed,
    ServerRejected,
    ServerUnreachable,
    StreamLimits,
    parse_json,
    parse_kv_cache_tokens,
    read_capped,
    stream_events,
)
from ragserve.metrics import REPLICA_IN_FLIGHT
from ragserve.reports import ReplicaState
from ragserve.types import model_name

log = logging.getLogger(__name__)

ERROR_BODY_BYTES = 2048  # of a server's error text, for the log
# One SSE line of JSON for one token's chunk is a few hundred bytes. aiohttp refuses a line longer
# than twice its read buffer, so this bounds what one line can cost.
READ_BUFFER_BYTES = 64 << 10
# Background connections per server: a probe, a /metrics read and a warming stream at once.
BACKGROUND_POOL = 4
# Answers a server must have given before its TTFT p95 sets the hedge bound.
HEDGE_MIN_SAMPLES = 20
# What a caller told to come back (the servers' queues are full) waits first.
OVERLOADED_RETRY_MS = 500


@dataclass(frozen=True, slots=True)
class ServerTimeouts:
    connect_s: float  # to open a TCP connection
    probe_s: float  # a whole probe or capped GET
    stall_s: float  # the longest silence inside a streamed answer
    keepalive_s: float  # idle connections close before the server drops them


def server_label(url: str) -> str:
    """Scheme, host and port only: what logs, metrics and Info show (no credentials, path or query)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return "invalid-url"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


@dataclass
class VllmServer:
    url: str
    pool_size: int
    timeouts: ServerTimeouts
    headers: dict[str, str]
    up: bool = False
    checked: bool = False  # its /v1/models was seen to serve our model
    served_model: str = ""  # the name this server serves our model under (each server its own)
    refusal: str = ""  # why its model was refused, while it is (logged once per change)
    failures: int = 0
    in_flight: int = 0  # request streams open (each holds one of its request connections)
    background_in_flight: int = 0
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    _requests: aiohttp.ClientSession | None = None
    _background: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self.label = server_label(self.url)

    def open(self) -> None:
        # No transparent decompression: a small compressed body must not become a large one here.
        headers = {**self.headers, "Accept-Encoding": "identity"}
        self._requests = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.pool_size, keepalive_timeout=self.timeouts.keepalive_s),
            # sock_read: the stall limit between two reads of a stream. No pool wait: `has_room` is
            # checked first, so a request never queues for a connection.
            timeout=aiohttp.ClientTimeout(
                total=None, connect=None, sock_connect=self.timeouts.connect_s, sock_read=self.timeouts.stall_s
            ),
            headers=headers,
            auto_decompress=False,
            read_bufsize=READ_BUFFER_BYTES,
        )
        self._background = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=BACKGROUND_POOL, keepalive_timeout=self.timeouts.keepalive_s),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeouts.connect_s, sock_read=self.timeouts.stall_s
            ),
            headers=headers,
            auto_decompress=False,
            read_bufsize=READ_BUFFER_BYTES,
        )

    async def close(self) -> None:
        for session in (self._requests, self._background):
            if session is not None:
                await session.close()
        self._requests = self._background = None

    @property
    def has_room(self) -> bool:
        return self.in_flight < self.pool_size

    def ttft_p95_ms(self) -> float | None:
        if len(self.ttft_ms) < HEDGE_MIN_SAMPLES:
            return None
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    def state(self) -> ReplicaState:
        return ReplicaState(self.label, self.up, self.in_flight)

    # -- probes and reads on the background pool ------------------------------------------------

    async def check_health(self) -> None:
        """Its /health status; the body is never read (closing an unread body drops the connection)."""
        async with self._get("/health") as response:
            if response.status != 200:
                raise ServerFailed(f"/health answered HTTP {response.status}")

    async def open_connections(self, count: int) -> None:
        """Open `count` request connections now, before a call needs one (a /health each)."""

        async def one() -> None:
            assert self._requests is not None
            try:
                async with asyncio.timeout(self.timeouts.probe_s):
                    async with self._requests.get(self.url + "/health", allow_redirects=False) as response:
                        if response.status != 200:
                            raise ServerFailed(f"/health answered HTTP {response.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ServerFailed(f"/health: {type(exc).__name__}") from exc

        await asyncio.gather(*(one() for _ in range(min(count, self.pool_size))))

    async def models(self) -> list[ServedModel]:
        """What /v1/models lists; a body that is not vLLM's shape is a failure of this server."""
        data = parse_json(await self._read("/v1/models", MODELS_MAX_BYTES), "/v1/models")
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise ServerFailed("/v1/models: no list under 'data'")
        served = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise ServerFailed("/v1/models: an entry without a string 'id'")
            root = entry.get("root")
            length = entry.get("max_model_len")
            served.append(
                ServedModel(
                    entry["id"],
                    root if isinstance(root, str) else "",
                    length if isinstance(length, int) and not isinstance(length, bool) else None,
                )
            )
        return served

    async def check_model(self, wanted: set[str], ours: str) -> None:
        """The name it serves our model under (`wanted`: its name or folder, or the configured
        served name; each server its own: an alias on one, a path on another). ConfigError when it
        serves another model: a deployment mistake, not an outage."""
        served = await self.models()
        match = [m for m in served if m.id in wanted or model_name(m.root) in wanted]
        if not match:
            names = ", ".join(repr(m.id[:80]) for m in served[:8]) or "none"
            raise ConfigError(
                f"generation server {self.label} serves {names}, not {ours} "
                "(RAGSERVE_GENERATOR_MODEL / RAGSERVE_GENERATOR_REMOTE_MODEL)"
            )
        self.refusal = ""
        if self.served_model and self.served_model != match[0].id:
            log.warning("generation server %s now serves our model as %r", self.label, match[0].id)
        self.served_model = match[0].id
        self.checked = True

    async def reported_kv_cache_tokens(self) -> int:
        """`kv_cache_tokens`, or 0 (logged) when the server does not say or its answer is refused."""
        tokens, reason = 0, ""
        try:
            tokens = await self.kv_cache_tokens()
        except ServerFailed as exc:
            reason = f" ({exc})"
        if not tokens:
            log.info("generation server %s reports no KV cache size%s: nothing is pre-filled there", self.label, reason)
        return tokens

    async def kv_cache_tokens(self) -> int:
        """Tokens its KV cache holds, from /metrics (parsed off the event loop); 0 when not reported."""
        body = await self._read("/metrics", METRICS_MAX_BYTES)
        return await asyncio.to_thread(parse_kv_cache_tokens, body)

    @contextlib.asynccontextmanager
    async def _get(self, path: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """One GET on the background pool within the probe time limit, no redirects followed; a
        transport error is a ServerFailed. Leaving with the body unread drops the connection."""
        assert self._background is not None, "open() first"
        try:
            async with asyncio.timeout(self.timeouts.probe_s):
                async with self._background.get(self.url + path, allow_redirects=False) as response:
                    yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerFailed(f"{path}: {type(exc).__name__}: {exc}") from exc

    async def _read(self, path: str, max_bytes: int) -> bytes:
        async with self._get(path) as response:
            if response.status != 200:
                raise ServerFailed(f"{path} answered HTTP {response.status}")
            return await read_capped(response, path, max_bytes)

    # -- streamed completions --------------------------------------------------------------------

    async def events(
        self, body: dict[str, Any], headers: dict[str, str], limits: StreamLimits, background: bool = False
    ) -> AsyncGenerator[tuple[str, Any], None]:
        """("text", delta), ("finish", reason), ("usage", Usage) from this server's stream. Raises
        ServerFailed for anything this server did wrong; Overloaded when it says its queue is full.
        Closing the generator early drops the connection, which aborts the request on the server."""
        session = self._background if background else self._requests
        assert session is not None, "open() first"
        if not background and not self.has_room:
            raise Overloaded("every connection to the generation server is busy", OVERLOADED_RETRY_MS)
        self._count(background, +1)
        response: aiohttp.ClientResponse | None = None
        complete = False
        try:
            try:
                response = await session.post(
                    self.url + "/v1/completions", data=orjson.dumps(body), headers=headers, allow_redirects=False
                )
            except aiohttp.ServerTimeoutError as exc:
                raise ServerFailed(f"no answer head within the stall limit: {type(exc).__name__}") from exc
            except aiohttp.ClientConnectionError as exc:
                raise ServerUnreachable(f"{type(exc).__name__}: {exc}") from exc
            except aiohttp.ClientError as exc:
                raise ServerFailed(f"{type(exc).__name__}: {exc}") from exc
            if response.status != 200:
                await self._refused(response)
            async for event in stream_events(response, limits):
                yield event
            complete = True
        finally:
            if response is not None and complete:
                response.release()
            elif response is not None:
                response.close()  # cut short: the connection is dropped, which aborts the request there
            self._count(background, -1)

    def _count(self, background: bool, step: int) -> None:
        if background:
            self.background_in_flight += step
        else:
            self.in_flight += step
            REPLICA_IN_FLIGHT.labels(self.label).set(self.in_flight)

    async def _refused(self, response: aiohttp.ClientResponse) -> None:
        try:
            detail = (await response.content.read(ERROR_BODY_BYTES)).decode(errors="replace")
        except Exception as exc:  # a broken error body is still the same refusal
            detail = f"(unreadable: {type(exc).__name__})"
        # %r: the server's text cannot forge log lines with newlines of its own.
        log.warning("generation server %s answered HTTP %d: %r", self.label, response.status, detail)
        if response.status in (429, 503):
            raise Overloaded("the generation servers are busy", OVERLOADED_RETRY_MS)
        if response.status == 400:
            raise ServerRejected("HTTP 400 (the prompt, or a request field the server does not accept)")
        raise ServerFailed(f"HTTP {response.status}")
