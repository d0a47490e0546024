"""Generation on vLLM's OpenAI-compatible servers: a pool of them, or one router in front of them.

The prompt is rendered here exactly as the in-process engine renders it (same chat template, same
tokenizer) and sent as token ids to `/v1/completions`, so the template prefix is the same tokens on
every server and their prefix caches hit. One server and what it may send: `generate/vllm_server.py`
and `generate/vllm_wire.py`; which server: `generate/routing.py`. This module is the pool: start,
fail-over, one hedge (`generate/hedge.py`), the breaker, health, and warming
on each server's background connections (docs/remote.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ragserve.config import GeneratorSettings
from ragserve.errors import ConfigError, Overloaded, Unavailable
from ragserve.events import GenerationChunk
from ragserve.generate.hedge import Events, first_event
from ragserve.generate.host import CPU_BLOCK_SIZE, read_host_cpu, resolve_reuse_pad
from ragserve.generate.identity import answer_identity
from ragserve.generate.rendering import ChatRenderer
from ragserve.generate.routing import hedge_after_s, order_servers, routing_key
from ragserve.generate.vllm_server import OVERLOADED_RETRY_MS, ServerTimeouts, VllmServer
from ragserve.generate.vllm_wire import ServerFailed, ServerUnreachable, StreamLimits
from ragserve.metrics import REPLICA_REQUESTS, REPLICA_UP
from ragserve.prompt import Prompt, build_prompt
from ragserve.reports import EngineChoice, GeneratorStatus, ReplicaState
from ragserve.types import WARMING_ENGINE_PRIORITY, GenerateParams, model_name

log = logging.getLogger(__name__)

# At start, the probe's own connections to open per server (concurrent requests need one each).
_WARM_CONNECTIONS = 8


class RemoteVllmGenerator:
    def __init__(self, settings: GeneratorSettings, pool_size: int, probe_timeout_s: float) -> None:
        self._settings = settings
        self._model = settings.resolved_model()
        self._renderer = ChatRenderer(self._model, settings.block_size or CPU_BLOCK_SIZE, settings.reuse_pad_max_tokens)
        self._pool_size = settings.remote_pool_size or pool_size
        self._round_robin = itertools.count()
        self._host = read_host_cpu()
        self._bringing_up: set[asyncio.Task[None]] = set()
        headers = {"Content-Type": "application/json"}
        if settings.remote_api_key is not None:
            headers["Authorization"] = f"Bearer {settings.remote_api_key.get_secret_value()}"
        timeouts = ServerTimeouts(
            connect_s=settings.remote_connect_timeout_s,
            probe_s=probe_timeout_s,
            stall_s=settings.remote_stall_s,
            keepalive_s=settings.remote_keepalive_s,
        )
        self.servers = [VllmServer(url, self._pool_size, timeouts, headers) for url in settings.remote_url_list()]
        # The server count is not part of an answer's identity (the pool may grow without emptying it).
        self._reuse_pad = resolve_reuse_pad(settings, settings.block_size or CPU_BLOCK_SIZE)
        self._identity = answer_identity(self.model_id, self._model, [self._reuse_pad])

    @property
    def model_id(self) -> str:
        return self._settings.remote_model or model_name(self._model)

    @property
    def answer_identity(self) -> str:
        return self._identity

    @property
    def engine_choices(self) -> tuple[EngineChoice, ...]:
        s = self._settings
        routing = s.remote_routing if len(self.servers) > 1 else f"by the server (header {s.remote_routing_header})"
        after = s.remote_hedge_after_ms
        hedge = "off" if after < 0 else f"{after:g} ms" if after else "TTFT p95"
        return (
            EngineChoice("backend", "remote", "RAGSERVE_GENERATOR_BACKEND"),
            EngineChoice("servers", str(len(self.servers)), "RAGSERVE_GENERATOR_REMOTE_URLS"),
            EngineChoice("routing", routing, "RAGSERVE_GENERATOR_REMOTE_ROUTING"),
            EngineChoice("hedge_after", hedge, "RAGSERVE_GENERATOR_REMOTE_HEDGE_AFTER_MS"),
            self._reuse_pad,
        )

    @property
    def host_cpu(self) -> str:
        return self._host.describe()

    def replica_states(self) -> list[ReplicaState]:
        return [server.state() for server in self.servers]

    def status(self) -> GeneratorStatus:
        return GeneratorStatus(False, tuple(self.replica_states()), by_priority=self._settings.remote_priority)

    # -- start and health --------------------------------------------------------------------------

    async def start(self) -> None:
        """Tokenizer, connection pools, and for every server: the model it serves, then the template
        prefix into its prefix cache, each within RAGSERVE_GENERATOR_REMOTE_START_TIMEOUT_S. Returns
        once one server is up; the others go on coming up in the background (or the probes bring
        them up later). A server serving another model before then is a deployment mistake."""
        await asyncio.to_thread(self._renderer.load)
        for server in self.servers:
            server.open()
        pending = {asyncio.create_task(self._bring_up(server)) for server in self.servers}
        try:
            while pending and not any(s.up for s in self.servers):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if isinstance(task.exception(), ConfigError):
                        raise task.exception()  # type: ignore[misc]
        except BaseException:
            for task in pending:
                task.cancel()
            raise
        self._bringing_up = pending
        if not any(s.up for s in self.servers):
            raise Unavailable("no generation server answered (RAGSERVE_GENERATOR_REMOTE_URLS)")
        log.info("generation servers: %s", ", ".join(f"{s.label} {'up' if s.up else 'down'}" for s in self.servers))

    async def _bring_up(self, server: VllmServer) -> None:
        try:
            async with asyncio.timeout(self._settings.remote_start_timeout_s):
                await self._check_model(server)
                await server.open_connections(_WARM_CONNECTIONS)
                await self._warm(server)
        except ConfigError as exc:
            log.error("generation server %s refused: %s", server.label, exc)
            self._set_up(server, False)
            raise
        except (ServerFailed, Overloaded, TimeoutError) as exc:
            reason = (
                "no answer within RAGSERVE_GENERATOR_REMOTE_START_TIMEOUT_S" if isinstance(exc, TimeoutError) else exc
            )
            log.warning("generation server %s not ready: %s", server.label, reason)
            self._set_up(server, False)
            return
        except Exception:
            log.exception("generation server %s not ready", server.label)
            self._set_up(server, False)
            return
        self._set_up(server, True)

    async def _check_model(self, server: VllmServer) -> None:
        named = self._settings.remote_model
        await server.check_model({named} if named else {self._model, model_name(self._model)}, self.model_id)

    async def _warm(self, server: VllmServer) -> None:
        """Put the template prefix into the server's prefix cache."""
        await self._prefill_on(server, build_prompt("Warm-up.", []), {})

    async def check_health(self) -> None:
        """Probe every server (its /health, and its model when it was down); UNAVAILABLE only when
        none is up. A busy server is up: probes have their own connections."""
        await asyncio.gather(*(self._probe(server) for server in self.servers))
        if not any(server.up for server in self.servers):
            raise Unavailable("no generation server is up")

    async def _probe(self, server: VllmServer) -> None:
        try:
            await server.check_health()
            if not server.checked:
                await self._check_model(server)
        except ConfigError as exc:
            if server.refusal != str(exc):  # once per change: the probe repeats every few seconds
                log.error("%s; it stays down", exc)
            server.refusal = str(exc)
            self._set_up(server, False)
            return
        except ServerFailed as exc:
            if server.up:
                log.warning("generation server %s failed its probe: %s", server.label, exc)
            self._set_up(server, False)
            return
        except Exception:  # whatever a server sends, one probe never ends the probing
            log.exception("generation server %s: the probe failed", server.label)
            self._set_up(server, False)
            return
        self._set_up(server, True)

    def _set_up(self, server: VllmServer, up: bool) -> None:
        if server.up != up:
            log.log(
                logging.INFO if up else logging.WARNING,
                "generation server %s is %s",
                server.label,
                "up" if up else "down",
            )
        server.up = up
        if up:
            server.failures = 0
        else:
            server.checked = False  # a server that comes back is asked its model again (it may have changed)
        REPLICA_UP.labels(server.label).set(1 if up else 0)

    def _failed(self, server: VllmServer, exc: BaseException) -> None:
        """A call to the server failed: down at once when it cannot be reached, else after a few."""
        server.failures += 1
        REPLICA_REQUESTS.labels(server.label, "failed").inc()
        log.warning("generation server %s failed a request: %s", server.label, exc)
        if isinstance(exc, ServerUnreachable) or server.failures >= self._settings.remote_breaker_failures:
            self._set_up(server, False)

    # -- routing ---------------------------------------------------------------------------------

    def _order(self, key: str) -> list[VllmServer]:
        """The servers to try, best first: up ones only (none: UNAVAILABLE at once)."""
        up = [s for s in self.servers if s.up]
        if not up:
            raise Unavailable("no generation server is up")
        return order_servers(up, key, self._settings.remote_routing, self._round_robin)

    def _hedge_after_s(self, server: VllmServer) -> float | None:
        return hedge_after_s(self._settings.remote_hedge_after_ms, server.ttft_p95_ms())

    def _body(self, prompt: Prompt, params: GenerateParams) -> dict[str, Any]:
        """The request without its per-server fields (model name, request id: see `_for`)."""
        return {
            "prompt": self._renderer.encode(self._renderer.render(prompt)),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **({"priority": params.priority} if self._settings.remote_priority else {}),
        }

    @staticmethod
    def _for(server: VllmServer, body: dict[str, Any]) -> dict[str, Any]:
        # Our own id, fresh for every attempt (a hedge too): a client's id must never reach a
        # server, and two attempts must never share one.
        return {**body, "model": server.served_model, "request_id": uuid.uuid4().hex}

    def _headers(self, prompt: Prompt) -> dict[str, str]:
        key = routing_key(prompt)
        return {self._settings.remote_routing_header: key} if key else {}

    # -- streaming -------------------------------------------------------------------------------

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        body = await asyncio.to_thread(self._body, prompt, params)  # the chat template takes ms: off the loop
        limits = StreamLimits.for_tokens(params.max_tokens, self._renderer.longest_token_chars)
        log.debug("request %s to the generation servers", trace_id)
        headers = self._headers(prompt)
        order = [s for s in self._order(routing_key(prompt)) if s.has_room]
        if not order:  # every connection of every server that is up is streaming: busy, not down
            raise Overloaded("every connection to the generation servers is busy", OVERLOADED_RETRY_MS)
        server, events, first = await self._first_event(order, body, headers, limits)
        try:
            async for chunk in self._chunks(server, events, first):
                yield chunk
        finally:
            await events.aclose()  # closing the stream aborts the request on the server

    async def _chunks(
        self, server: VllmServer, events: Events, first: tuple[str, Any]
    ) -> AsyncIterator[GenerationChunk]:
        finish = ""
        event: tuple[str, Any] | None = first
        try:
            while event is not None:
                kind, value = event
                if kind == "text":
                    yield GenerationChunk(value)
                elif kind == "finish":
                    finish = value
                elif kind == "usage":
                    REPLICA_REQUESTS.labels(server.label, "ok").inc()
                    server.failures = 0
                    yield GenerationChunk("", True, finish, value)
                    return
                event = await anext(events, None)
        except ServerFailed as exc:
            self._failed(server, exc)
            raise Unavailable("the generation server failed mid-answer") from exc
        # A stream that ends without its usage chunk was cut: never a silent short answer.
        self._failed(server, ServerFailed("stream ended early"))
        raise Unavailable("the generation server failed mid-answer")

    async def _first_event(
        self, order: list[VllmServer], body: dict[str, Any], headers: dict[str, str], limits: StreamLimits
    ) -> tuple[VllmServer, Events, tuple[str, Any]]:
        return await first_event(
            order,
            lambda server: server.events(self._for(server, body), headers, limits),
            self._hedge_after_s(order[0]),
            self._failed,
        )

    # -- warming ---------------------------------------------------------------------------------

    async def prefill(self, prompt: Prompt) -> None:
        """Put `prompt` into the prefix cache of the server its questions go to, on that server's
        background connections, after every Query where the servers schedule by priority. Each
        stream is bounded by the stall limit; a failure is logged by the caller and costs no call."""
        await self._settle()
        await self._prefill_on(self._order(routing_key(prompt))[0], prompt, self._headers(prompt))

    async def _settle(self) -> None:
        # Warming waits for the servers still coming up: a passage warmed before its server is up
        # would land where its questions never go.
        if self._bringing_up:
            await asyncio.wait(self._bringing_up)

    async def _prefill_on(self, server: VllmServer, prompt: Prompt, headers: dict[str, str]) -> None:
        params = GenerateParams(max_tokens=1, temperature=0.0, priority=WARMING_ENGINE_PRIORITY)
        body = self._for(server, await asyncio.to_thread(self._body, prompt, params))
        async with asyncio.timeout(self._settings.remote_stall_s):
            async with contextlib.aclosing(server.events(body, headers, StreamLimits.for_tokens(1), True)) as events:
                async for _ in events:
                    pass

    # -- sizes and counts ------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return self._renderer.count_tokens(text)

    def prompt_tokens(self, prompt: Prompt) -> int:
        return len(self._renderer.encode(self._renderer.render(prompt)))  # the ids the servers are sent

    def unfinished_requests(self) -> int:
        return sum(s.in_flight + s.background_in_flight for s in self.servers)

    async def kv_cache_tokens(self) -> int:
        """KV cache tokens of the servers that are up, summed; 0 for one that does not report it (a router)."""
        await self._settle()
        up = [s for s in self.servers if s.up]
        return sum(await asyncio.gather(*(s.reported_kv_cache_tokens() for s in up)))

    async def close(self) -> None:
        for task in self._bringing_up:
            task.cancel()
        await asyncio.gather(*self._bringing_up, return_exceptions=True)
        self._bringing_up = set()
        for server in self.servers:
            await server.close()
