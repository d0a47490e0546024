"""Generation on vLLM's OpenAI-compatible servers: a pool of them, or one router in front of them.

The prompt is rendered here exactly as the in-process engine renders it (same chat template, same
tokenizer) and sent as token ids to `/v1/completions`, so the template prefix is the same tokens on
every server and their prefix caches hit. Each server has its own pool of HTTP/1.1 keep-alive
connections (aiohttp), opened before health turns SERVING and closed when idle before the server
would drop them.

Several servers and no router: the sidecar picks the server by rendezvous hashing on the prompt's
reuse key (its top passage), so questions about one document land where that document's KV already
sits; a server that is down or saturated is passed over. One URL (a router) gets the key in a header
it can hash on. One hedge at most: when the first server has sent no token within the bound, the
same prompt goes to the next one; the first token wins and the other request is aborted (closing
the HTTP stream aborts it on the server).

The servers' KV cache size comes from their own /metrics (`vllm:cache_config_info`), so the
pipeline can pre-fill the most retrieved passages there too, each on the server its questions go to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from ragserve.config import GeneratorSettings
from ragserve.errors import ConfigError, InvalidArgument, Overloaded, Unavailable
from ragserve.generate.host import read_host_cpu
from ragserve.generate.rendering import ChatRenderer
from ragserve.metrics import REPLICA_HEDGES, REPLICA_IN_FLIGHT, REPLICA_REQUESTS, REPLICA_UP
from ragserve.prompt import Prompt, build_prompt
from ragserve.types import EngineChoice, GenerateParams, GenerationChunk, ReplicaState, Usage, model_name

log = logging.getLogger(__name__)

# A server's error body is read for the log only, and never all of it.
_ERROR_BODY_BYTES = 2048
# Answers a server must have given before its TTFT p95 sets the hedge bound.
_HEDGE_MIN_SAMPLES = 20
# What a caller told to come back (the servers' queues are full) waits first.
_OVERLOADED_RETRY_MS = 500
# vLLM's info gauge of its cache config: labels block_size and num_gpu_blocks (its KV blocks, on
# any device), one sample per engine of the server.
_CACHE_INFO = "vllm:cache_config_info"


class ReplicaFailed(Exception):
    """This server could not serve the request (failing, or cut off): another one may."""


class ReplicaUnreachable(ReplicaFailed):
    """No connection to this server: it is down until a probe says otherwise."""


@dataclass
class Replica:
    url: str
    session: aiohttp.ClientSession | None = None
    up: bool = False
    checked: bool = False  # its /v1/models was seen to serve our model
    failures: int = 0
    in_flight: int = 0
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=200))

    def ttft_p95_ms(self) -> float | None:
        if len(self.ttft_ms) < _HEDGE_MIN_SAMPLES:
            return None
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    @property
    def label(self) -> str:
        """The URL without credentials: what logs, metrics and Info show."""
        parts = urlsplit(self.url)
        return (
            urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
            if parts.hostname
            else self.url
        )

    def state(self) -> ReplicaState:
        return ReplicaState(self.label, self.up, self.in_flight)


class RemoteVllmGenerator:
    def __init__(self, settings: GeneratorSettings, pool_size: int, probe_timeout_s: float) -> None:
        self._settings = settings
        self._model = settings.resolved_model()
        self._renderer = ChatRenderer(self._model)
        self._served_model = settings.remote_model
        self._pool_size = settings.remote_pool_size or pool_size
        self._probe_timeout_s = probe_timeout_s
        self.replicas = [Replica(url) for url in settings.remote_url_list()]
        self._round_robin = itertools.count()
        self._host = read_host_cpu()
        self._headers = {"Content-Type": "application/json"}
        if settings.remote_api_key is not None:
            self._headers["Authorization"] = f"Bearer {settings.remote_api_key.get_secret_value()}"

    @property
    def model_id(self) -> str:
        return model_name(self._model)

    @property
    def engine_choices(self) -> tuple[EngineChoice, ...]:
        s = self._settings
        routing = s.remote_routing if len(self.replicas) > 1 else f"by the server (header {s.remote_routing_header})"
        hedge = (
            "off"
            if s.remote_hedge_after_ms < 0
            else f"{s.remote_hedge_after_ms:g} ms"
            if s.remote_hedge_after_ms
            else "TTFT p95"
        )
        return (
            EngineChoice("backend", "remote", "RAGSERVE_GENERATOR_BACKEND"),
            EngineChoice("servers", str(len(self.replicas)), "RAGSERVE_GENERATOR_REMOTE_URLS"),
            EngineChoice("routing", routing, "RAGSERVE_GENERATOR_REMOTE_ROUTING"),
            EngineChoice("hedge_after", hedge, "RAGSERVE_GENERATOR_REMOTE_HEDGE_AFTER_MS"),
        )

    @property
    def host_cpu(self) -> str:
        return self._host.describe()

    def replica_states(self) -> list[ReplicaState]:
        return [replica.state() for replica in self.replicas]

    async def start(self) -> None:
        """Tokenizer, connection pools, and for every server: the model it serves, then the template
        prefix into its prefix cache. Serves once at least one server does; the others are probed."""
        await asyncio.to_thread(self._renderer.load)
        for replica in self.replicas:
            connector = aiohttp.TCPConnector(limit=self._pool_size, keepalive_timeout=self._settings.remote_keepalive_s)
            timeout = aiohttp.ClientTimeout(total=None, connect=self._settings.remote_connect_timeout_s)
            replica.session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers)
        results = await asyncio.gather(*(self._bring_up(r) for r in self.replicas), return_exceptions=True)
        for result in results:
            if isinstance(result, ConfigError):
                raise result  # a server with another model is a deployment mistake, not an outage
        if not any(r.up for r in self.replicas):
            raise Unavailable("no generation server answered (RAGSERVE_GENERATOR_REMOTE_URLS)")
        log.info("generation servers: %s", ", ".join(f"{r.label} {'up' if r.up else 'down'}" for r in self.replicas))

    async def _bring_up(self, replica: Replica) -> None:
        try:
            await self._check_model(replica)
            await self._warm(replica)
        except ReplicaFailed as exc:
            log.warning("generation server %s not ready: %s", replica.label, exc)
            self._set_up(replica, False)
            return
        self._set_up(replica, True)

    async def _check_model(self, replica: Replica) -> None:
        data = await self._get_json(replica, "/v1/models")
        served = [m for m in data.get("data", []) if isinstance(m, dict)]
        wanted = {self._served_model} if self._served_model else {self._model, model_name(self._model)}
        match = [m for m in served if m.get("id") in wanted or model_name(str(m.get("root", ""))) in wanted]
        if not match:
            names = ", ".join(str(m.get("id")) for m in served) or "none"
            raise ConfigError(
                f"generation server {replica.label} serves {names}, not {self._served_model or self.model_id} "
                "(RAGSERVE_GENERATOR_MODEL / RAGSERVE_GENERATOR_REMOTE_MODEL)"
            )
        self._served_model = str(match[0]["id"])
        replica.checked = True

    async def _warm(self, replica: Replica) -> None:
        """Open the pool's connections (concurrent requests need one each) and put the template
        prefix into the server's prefix cache."""
        warm_connections = min(self._pool_size, 8)
        await asyncio.gather(*(self._get_json(replica, "/health", expect_json=False) for _ in range(warm_connections)))
        body = self._body(build_prompt("Warm-up.", []), GenerateParams(max_tokens=1, temperature=0.0))
        async for _ in self._events(replica, body, {}):
            pass

    async def _get_json(self, replica: Replica, path: str, expect_json: bool = True) -> Any:
        body = await self._get(replica, path)
        try:
            return orjson.loads(body) if expect_json else None
        except orjson.JSONDecodeError as exc:
            raise ReplicaFailed(f"{path}: {type(exc).__name__}: {exc}") from exc

    async def _get(self, replica: Replica, path: str) -> bytes:
        assert replica.session is not None
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                async with replica.session.get(replica.url + path) as response:
                    if response.status != 200:
                        raise ReplicaFailed(f"{path} answered HTTP {response.status}")
                    return await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ReplicaFailed(f"{path}: {type(exc).__name__}: {exc}") from exc

    def _set_up(self, replica: Replica, up: bool) -> None:
        if replica.up != up:
            log.log(
                logging.INFO if up else logging.WARNING,
                "generation server %s is %s",
                replica.label,
                "up" if up else "down",
            )
        replica.up = up
        replica.failures = 0 if up else replica.failures
        REPLICA_UP.labels(replica.label).set(1 if up else 0)

    def _failed(self, replica: Replica, exc: BaseException, definitive: bool) -> None:
        """A call to the server failed: down at once when it cannot be reached, else after a few."""
        replica.failures += 1
        REPLICA_REQUESTS.labels(replica.label, "failed").inc()
        log.warning("generation server %s failed a request: %s", replica.label, exc)
        if definitive or replica.failures >= self._settings.remote_breaker_failures:
            self._set_up(replica, False)

    def _order(self, key: str) -> list[Replica]:
        """The servers to try, best first: up ones only (none: UNAVAILABLE at once)."""
        up = [r for r in self.replicas if r.up]
        if not up:
            raise Unavailable("no generation server is up")
        if len(up) == 1:
            return up
        if self._settings.remote_routing == "round_robin" or not key:
            start = next(self._round_robin) % len(up)
            ordered = up[start:] + up[:start]
        else:
            # Rendezvous hashing: the same key picks the same server while it is up, and only the
            # keys of a server that goes away move.
            ordered = sorted(
                up, key=lambda r: hashlib.blake2b(f"{key}\x00{r.url}".encode(), digest_size=8).digest(), reverse=True
            )
        # A saturated server (all its connections busy) goes last: its queue would only grow.
        return sorted(ordered, key=lambda r: r.in_flight >= self._pool_size)

    def _hedge_after_s(self, replica: Replica) -> float | None:
        after = self._settings.remote_hedge_after_ms
        if after < 0:
            return None
        if after == 0:
            p95 = replica.ttft_p95_ms()
            return None if p95 is None else p95 / 1000.0
        return after / 1000.0

    def _body(self, prompt: Prompt, params: GenerateParams) -> dict[str, Any]:
        ids = self._renderer.encode(self._renderer.render(prompt))
        return {
            "model": self._served_model,
            "prompt": ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            # Our own id: a client's id must never reach a server (it could cross two callers' streams).
            "request_id": uuid.uuid4().hex,
            **({"priority": params.request_class.engine_priority} if self._settings.remote_priority else {}),
        }

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        body = await asyncio.to_thread(self._body, prompt, params)  # the chat template takes ms: off the loop
        log.debug("request %s to the generation servers as %s", trace_id, body["request_id"])
        key = routing_key(prompt)
        headers = {self._settings.remote_routing_header: key} if key else {}
        replica, events, first = await self._first_event(self._order(key), body, headers)
        try:
            async for chunk in self._chunks(replica, events, first):
                yield chunk
        finally:
            await events.aclose()  # closing the stream aborts the request on the server

    async def _chunks(
        self, replica: Replica, events: AsyncGenerator[tuple[str, Any], None], first: tuple[str, Any]
    ) -> AsyncIterator[GenerationChunk]:
        finish = ""
        event: tuple[str, Any] | None = first
        try:
            while event is not None:
                kind, value = event
                if kind == "text" and value:
                    yield GenerationChunk(value)
                elif kind == "finish":
                    finish = value
                elif kind == "usage":
                    REPLICA_REQUESTS.labels(replica.label, "ok").inc()
                    replica.failures = 0
                    yield GenerationChunk("", True, finish, value)
                    return
                event = await anext(events, None)
        except ReplicaFailed as exc:
            self._failed(replica, exc, definitive=False)
            raise Unavailable("the generation server failed mid-answer") from exc
        # A stream that ends without its usage chunk was cut: never a silent short answer.
        self._failed(replica, RuntimeError("stream ended early"), definitive=False)
        raise Unavailable("the generation server failed mid-answer")

    async def _first_event(
        self, order: list[Replica], body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Replica, AsyncGenerator[tuple[str, Any], None], tuple[str, Any]]:
        """Start on the first server; one more attempt at most, when it fails before its first event
        (fail-over) or sends nothing within the hedge bound (hedge). The first event wins."""
        spare = order[1:2]  # one more server at most, for the hedge or the fail-over
        running: dict[asyncio.Task[tuple[str, Any]], tuple[Replica, AsyncGenerator[tuple[str, Any], None], float]] = {}

        def launch(replica: Replica) -> None:
            events = self._events(replica, body, headers)
            running[asyncio.ensure_future(anext(events))] = (replica, events, time.perf_counter())

        launch(order[0])
        hedge_after = self._hedge_after_s(order[0])
        try:
            while running:
                wait = hedge_after if spare else None
                done, _ = await asyncio.wait(running, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # the hedge bound passed without a token
                    hedge_after = None
                    # Only onto a server less busy than the slow one: when all are slow because all
                    # are loaded, a hedge would only add load.
                    if spare[0].in_flight < order[0].in_flight:
                        REPLICA_HEDGES.inc()
                        launch(spare.pop(0))
                    continue
                for task in done:
                    replica, events, started = running.pop(task)
                    try:
                        first = task.result()
                    except (ReplicaFailed, StopAsyncIteration) as exc:
                        self._failed(replica, exc, definitive=isinstance(exc, ReplicaUnreachable))
                        await events.aclose()
                        if spare:
                            launch(spare.pop(0))
                            hedge_after = None
                        continue
                    replica.ttft_ms.append((time.perf_counter() - started) * 1000.0)
                    await self._abort(running)
                    return replica, events, first
            raise Unavailable("the generation servers failed before the answer started")
        except BaseException:
            await self._abort(running)
            raise

    @staticmethod
    async def _abort(
        running: dict[asyncio.Task[tuple[str, Any]], tuple[Replica, AsyncGenerator[tuple[str, Any], None], float]],
    ) -> None:
        for task, (_, events, _) in list(running.items()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await events.aclose()
        running.clear()

    async def _events(
        self, replica: Replica, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncGenerator[tuple[str, Any], None]:
        """("text", delta), ("finish", reason), ("usage", Usage) from one server's stream. Raises
        ReplicaFailed when this server cannot serve it; the caller's mistakes and a full queue as such."""
        assert replica.session is not None
        replica.in_flight += 1
        REPLICA_IN_FLIGHT.labels(replica.label).set(replica.in_flight)
        response: aiohttp.ClientResponse | None = None
        complete = False
        try:
            try:
                response = await replica.session.post(
                    replica.url + "/v1/completions", data=orjson.dumps(body), headers=headers
                )
            except aiohttp.ClientConnectionError as exc:
                raise ReplicaUnreachable(f"{type(exc).__name__}: {exc}") from exc
            if response.status != 200:
                detail = (await response.content.read(_ERROR_BODY_BYTES)).decode(errors="replace")
                log.warning("generation server %s answered HTTP %d: %s", replica.label, response.status, detail)
                if response.status == 400:
                    raise InvalidArgument(
                        "query", "the generator rejected the prompt (longer than its context with the passages?)"
                    )
                if response.status in (429, 503):
                    raise Overloaded("the generation servers are busy", _OVERLOADED_RETRY_MS)
                raise ReplicaFailed(f"HTTP {response.status}")
            try:
                # Read to the end of the body (past "[DONE]"): only a fully read response leaves its
                # connection in the pool.
                async for line in response.content:
                    payload = line[5:].strip() if line.startswith(b"data:") else b""
                    if payload and payload != b"[DONE]":
                        for event in _parse(orjson.loads(payload)):
                            yield event
                complete = True
            except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
                raise ReplicaFailed(f"stream cut: {type(exc).__name__}") from exc
        finally:
            if response is not None and complete:
                response.release()
            elif response is not None:
                response.close()  # cut short: the connection is dropped, which aborts the request there
            replica.in_flight -= 1
            REPLICA_IN_FLIGHT.labels(replica.label).set(replica.in_flight)

    async def check_health(self) -> None:
        """Probe every server (its /health, and its model once); UNAVAILABLE only when none is up."""
        await asyncio.gather(*(self._probe(r) for r in self.replicas))
        if not any(r.up for r in self.replicas):
            raise Unavailable("no generation server is up")

    async def _probe(self, replica: Replica) -> None:
        try:
            await self._get_json(replica, "/health", expect_json=False)
            if not replica.checked:
                await self._check_model(replica)
        except (ReplicaFailed, ConfigError) as exc:
            if replica.up:
                log.warning("generation server %s failed its probe: %s", replica.label, exc)
            self._set_up(replica, False)
            return
        self._set_up(replica, True)

    def count_tokens(self, text: str) -> int:
        return self._renderer.count_tokens(text)

    def unfinished_requests(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    async def kv_cache_tokens(self) -> int:
        """The KV cache of the servers that are up, summed: pre-filled passages spread over them by
        the routing questions take. A server that does not report its cache (a router in front of
        the servers, another engine) counts 0."""
        up = [r for r in self.replicas if r.up]
        return sum(await asyncio.gather(*(self._kv_cache_tokens(r) for r in up)))

    async def _kv_cache_tokens(self, replica: Replica) -> int:
        tokens, reason = 0, ""
        try:
            text = (await self._get(replica, "/metrics")).decode("utf-8", "replace")
            tokens = sum(
                int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
                for family in text_string_to_metric_families(text)
                if family.name == _CACHE_INFO
                for sample in family.samples
            )
        except (ReplicaFailed, ValueError, KeyError) as exc:
            reason = f" ({type(exc).__name__}: {exc})"
        if not tokens:
            log.info(
                "generation server %s reports no KV cache size%s: nothing is pre-filled there", replica.label, reason
            )
        return tokens

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.session is not None:
                await replica.session.close()
                replica.session = None


def routing_key(prompt: Prompt) -> str:
    """What decides the server: the template and the top passage (their KV is what can be reused).
    A hash: a router sees no document names, and a header no characters it could misread."""
    if not prompt.reuse_key:
        return ""
    return hashlib.blake2b(f"{prompt.system}\x00{prompt.reuse_key}".encode(), digest_size=12).hexdigest()


def _parse(chunk: dict[str, Any]) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    for choice in chunk.get("choices") or []:
        if choice.get("text"):
            events.append(("text", str(choice["text"])))
        if choice.get("finish_reason"):
            events.append(("finish", str(choice["finish_reason"])))
    usage = chunk.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        events.append(
            (
                "usage",
                Usage(
                    int(usage.get("prompt_tokens", 0)),
                    int(usage.get("completion_tokens", 0)),
                    int(details.get("cached_tokens") or 0),
                ),
            )
        )
    return events
