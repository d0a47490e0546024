"""FakeVllmServer: an HTTP server on loopback that speaks the part of vLLM's OpenAI-compatible API the
remote generator uses (/health, /v1/models, streaming /v1/completions, the cache size in /metrics),
scripted per test, including as a broken or hostile peer (bodies too large or compressed, malformed
JSON, streams that ignore max_tokens or go quiet, redirects). A fake, named as such: the end-to-end
tests run real vLLM servers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeVllmServer:
    model: str = "/models/SmolLM2-135M-Instruct"
    words: list[str] = field(default_factory=lambda: ["The", " answer", "."])
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    gate: asyncio.Event | None = None  # when given, each stream waits for it after its first word
    status: int = 200  # anything else: /v1/completions answers this status
    die_after_words: int | None = None  # drop the connection after this many words
    healthy: bool = True
    cached_tokens: int = 64
    kv_blocks: int | None = 100  # None: /metrics answers 404, as a router in front of servers may
    block_size: int = 32
    # Hostile or broken behaviour, each off by default.
    health_body: bytes = b""  # sent after /health's status, in pieces (counted in body_bytes_sent)
    health_encoding: str = ""  # a Content-Encoding header for that body (e.g. gzip)
    models_json: Any = None  # /v1/models answers this JSON instead of the model list
    models_delay_s: float = 0.0  # /v1/models answers this late (a server still loading its model)
    metrics_extra: bytes = b""  # appended to /metrics
    ignore_max_tokens: bool = False  # stream words until the client goes away
    raw_lines: list[bytes] | None = None  # the stream's bytes as scripted, instead of words
    stall_after_words: int | None = None  # go quiet (connection open) after this many words
    redirect_to: str = ""  # /v1/completions answers 307 to this URL
    error_body: str = '{"error": "scripted"}'
    body_bytes_sent: int = 0
    stream_chunks_sent: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    connections: set[tuple[str, int]] = field(default_factory=set)
    running: int = 0
    aborted: int = 0
    completed: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeVllmServer:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        # Like vLLM, notice a client that went away: the handler is cancelled (counted as aborted).
        self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _seen(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.connections.add((str(peer[0]), int(peer[1])))

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        if not self.health_body:
            return web.Response(status=200 if self.healthy else 500)
        headers = {"Content-Encoding": self.health_encoding} if self.health_encoding else {}
        return await self._send_body(request, self.health_body, headers)

    async def _send_body(self, request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
        """`body` in 64 KiB pieces, counting what was written before the client went away."""
        response = web.StreamResponse(status=200 if self.healthy else 500, headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            for start in range(0, len(body), 1 << 16):
                piece = body[start : start + (1 << 16)]
                await response.write(piece)
                self.body_bytes_sent += len(piece)
            await response.write_eof()
        return response

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        await asyncio.sleep(self.models_delay_s)
        if self.models_json is not None:
            return web.json_response(self.models_json)
        return web.json_response({"object": "list", "data": [{"id": self.model, "root": self.model}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.kv_blocks is None:
            return web.Response(status=404)
        # vLLM's shape: an info gauge per engine, the cache config in its labels.
        labels = f'block_size="{self.block_size}",cache_dtype="auto",engine="0",num_gpu_blocks="{self.kv_blocks}"'
        text = self.metrics_extra.decode() + (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {self.running}.0\n'
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{labels}}} 1.0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.redirect_to:
            raise web.HTTPTemporaryRedirect(self.redirect_to + "/v1/completions")
        if self.status != 200:
            return web.Response(status=self.status, text=self.error_body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.running += 1
        try:
            await asyncio.sleep(self.first_token_delay_s)
            if self.raw_lines is not None:
                for line in self.raw_lines:
                    await response.write(line)
                    self.stream_chunks_sent += 1
                await response.write_eof()
                self.completed += 1
                return response
            if self.ignore_max_tokens:
                while True:  # until the client goes away (its write fails, or the handler is cancelled)
                    await _send(response, {"choices": [{"index": 0, "text": " more", "finish_reason": None}]})
                    self.stream_chunks_sent += 1
                    await asyncio.sleep(0)
            words = self.words[: body.get("max_tokens", len(self.words))]
            for i, word in enumerate(words):
                if self.stall_after_words is not None and i == self.stall_after_words:
                    await asyncio.sleep(3600)
                if self.die_after_words is not None and i == self.die_after_words:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if i == 1 and self.gate is not None:
                    await self.gate.wait()
                if i:
                    await asyncio.sleep(self.token_delay_s)
                finish = "stop" if i == len(words) - 1 else None
                await _send(response, {"choices": [{"index": 0, "text": word, "finish_reason": finish}], "usage": None})
            usage = {
                "prompt_tokens": len(body["prompt"]),
                "completion_tokens": len(words),
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            }
            await _send(response, {"choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self.completed += 1
        except (asyncio.CancelledError, ConnectionError):
            self.aborted += 1  # the client closed the stream: vLLM aborts the request here
            raise
        finally:
            self.running -= 1
        return response


async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
