"""What a vLLM server's answers may hold, and reading them: capped bodies, a streamed answer's events
within their limits, completion chunks and the `/metrics` cache size, every field type-checked.
Functions over bytes and one response; the connections are `generate/vllm_server.py`'s.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from ragserve.events import Usage

# Caps on what a server's answers may hold (docs/remote.md, "What a server may send").
MODELS_MAX_BYTES = 1 << 20
METRICS_MAX_BYTES = 8 << 20
# A token's text is at most a few dozen characters in common vocabularies: a stream is bounded by
# the served model's own longest token (generate/rendering.py), and never past this.
CHARS_PER_TOKEN_MAX = 256
# Events beyond one per token: the finish chunk, the usage chunk, a little slack.
EXTRA_EVENTS = 8
# vLLM's info gauge of its cache config: labels block_size and num_gpu_blocks, one sample per engine.
CACHE_INFO = "vllm:cache_config_info"
FINISH_REASONS = frozenset({"stop", "length"})
INT32_MAX = (1 << 31) - 1


class ServerFailed(Exception):
    """This server could not serve the request (failing, cut off, or sent something malformed)."""


class ServerUnreachable(ServerFailed):
    """No connection to this server: it is down until a probe says otherwise."""


class ServerRejected(ServerFailed):
    """The server refused the request as invalid (HTTP 400): its configuration or our prompt."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    root: str
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one streamed answer may send, from the `max_tokens` it asked for."""

    events: int
    chars: int

    @classmethod
    def for_tokens(cls, max_tokens: int, longest_token_chars: int = CHARS_PER_TOKEN_MAX) -> StreamLimits:
        """`longest_token_chars`: the most text one token of the served model decodes to (0: not known)."""
        per_token = min(longest_token_chars, CHARS_PER_TOKEN_MAX) if longest_token_chars > 0 else CHARS_PER_TOKEN_MAX
        return cls(max_tokens + EXTRA_EVENTS, max(1, max_tokens) * per_token)


async def read_capped(response: aiohttp.ClientResponse, path: str, max_bytes: int) -> bytes:
    """The body, if it is plain and at most `max_bytes`; else ServerFailed (nothing past the cap is read)."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ServerFailed(f"{path}: a {encoding!r}-encoded body (asked for identity)")
    if response.content_length is not None and response.content_length > max_bytes:
        raise ServerFailed(f"{path}: {response.content_length} bytes, more than {max_bytes}")
    body = bytearray()
    async for piece in response.content.iter_chunked(64 << 10):
        body += piece
        if len(body) > max_bytes:
            raise ServerFailed(f"{path}: more than {max_bytes} bytes")
    return bytes(body)


def parse_kv_cache_tokens(body: bytes) -> int:
    """KV cache tokens in all from vLLM's `vllm:cache_config_info` samples (blocks x block size).
    Only those lines are looked at; a sample without both labels as integers is a failure."""
    tokens = 0
    prefix = CACHE_INFO.encode() + b"{"
    for line in body.splitlines():
        if not line.startswith(prefix):
            continue
        labels = _labels(line[len(prefix) : line.rfind(b"}")].decode("utf-8", "replace"))
        try:
            blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
        except (KeyError, ValueError) as exc:
            raise ServerFailed(f"/metrics: {CACHE_INFO} without integer blocks ({type(exc).__name__})") from exc
        if not (0 <= blocks <= INT32_MAX and 0 < size <= 1 << 16):
            raise ServerFailed(f"/metrics: {CACHE_INFO} with {blocks} blocks of {size}")
        tokens += blocks * size
    return tokens


def _labels(text: str) -> dict[str, str]:
    """Prometheus labels `a="1",b="x"` (values here are numbers and names: no escapes needed)."""
    labels = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        labels[name.strip()] = value.strip().strip('"')
    return labels


async def stream_events(
    response: aiohttp.ClientResponse, limits: StreamLimits
) -> AsyncGenerator[tuple[str, Any], None]:
    events = chars = lines = 0
    max_lines = 2 * limits.events + EXTRA_EVENTS  # "data: ..." and a blank line per event
    try:
        # Read to the end of the body (past "[DONE]"): only a fully read response leaves its
        # connection in the pool.
        async for line in response.content:
            lines += 1
            if lines > max_lines:
                raise ServerFailed(f"more than {max_lines} lines for max_tokens")
            payload = line[5:].strip() if line.startswith(b"data:") else b""
            if not payload or payload == b"[DONE]":
                continue
            events += 1
            if events > limits.events:
                raise ServerFailed(f"more than {limits.events} events (the server ignores max_tokens?)")
            for kind, value in parse_chunk(orjson.loads(payload)):
                if kind == "text":
                    chars += len(value)
                    if chars > limits.chars:
                        raise ServerFailed(f"more than {limits.chars} characters (the server ignores max_tokens?)")
                yield kind, value
    except ServerFailed:
        raise
    except aiohttp.ServerTimeoutError as exc:
        raise ServerFailed("silent for longer than the stall limit (RAGSERVE_GENERATOR_REMOTE_STALL_S)") from exc
    except Exception as exc:  # anything else in a stream's bytes is this server's fault
        raise ServerFailed(f"stream broken: {type(exc).__name__}") from exc


def parse_chunk(chunk: object) -> list[tuple[str, Any]]:
    """One streamed completion chunk; anything not of the API's shape raises ServerFailed."""
    if not isinstance(chunk, dict):
        raise ServerFailed("a stream chunk that is not an object")
    events: list[tuple[str, Any]] = []
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise ServerFailed("'choices' is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise ServerFailed("a choice that is not an object")
        text, finish = choice.get("text"), choice.get("finish_reason")
        if text is not None and not isinstance(text, str):
            raise ServerFailed("a choice's 'text' is not a string")
        if text:
            events.append(("text", text))
        if finish is not None:
            if finish not in FINISH_REASONS:
                raise ServerFailed(f"finish_reason {str(finish)[:32]!r}")
            events.append(("finish", finish))
    usage = chunk.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            raise ServerFailed("'usage' is not an object")
        details = usage.get("prompt_tokens_details") or {}
        if not isinstance(details, dict):
            raise ServerFailed("'prompt_tokens_details' is not an object")
        events.append(
            (
                "usage",
                Usage(
                    _count(usage.get("prompt_tokens")),
                    _count(usage.get("completion_tokens")),
                    _count(details.get("cached_tokens")),
                ),
            )
        )
    return events


def _count(value: object) -> int:
    """A token count: a non-negative integer, clamped to what the API's int32 fields carry."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServerFailed(f"a token count that is not an integer: {str(value)[:32]!r}")
    return min(max(value, 0), INT32_MAX)


def parse_json(body: bytes, path: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ServerFailed(f"{path}: not JSON ({exc})") from exc
