"""A Python client with one long-lived channel (loopback or a Unix socket)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import TracebackType

import grpc

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

# Retry UNAVAILABLE (a restarting sidecar) a few times; the service config is grpc's own mechanism.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "ragserve.v1.RagService"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

CHANNEL_OPTIONS = [
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # Ping every 30 s so idle sidecar connections stay up; the server permits 10 s.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def target_for(host: str = "127.0.0.1", port: int = 50051, uds_path: str = "") -> str:
    return f"unix:{uds_path}" if uds_path else f"{host}:{port}"


class RagClient:
    """Use as `async with RagClient(target) as client:`; keep one per process and reuse it."""

    def __init__(self, target: str, default_timeout_s: float = 30.0) -> None:
        self.target = target
        self.default_timeout_s = default_timeout_s
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.RagServiceStub(self._channel)

    async def __aenter__(self) -> RagClient:
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)

    async def retrieve(
        self,
        query: str,
        top_k: int = 0,
        budget_ms: int = 0,
        timeout_s: float | None = None,
        dedupe_documents: bool = False,
    ) -> pb.RetrieveResponse:
        request = pb.RetrieveRequest(query=query, top_k=top_k, budget_ms=budget_ms, dedupe_documents=dedupe_documents)
        response: pb.RetrieveResponse = await self._stub.Retrieve(request, timeout=timeout_s or self.default_timeout_s)
        return response

    async def query(
        self,
        query: str,
        top_k: int = 0,
        max_tokens: int = 0,
        temperature: float = 0.0,
        budget_ms: int = 0,
        timeout_s: float | None = None,
        context_token_budget: int | None = None,
    ) -> AsyncIterator[pb.QueryEvent]:
        """Events in order: one `retrieval`, `token` deltas, one `final`.

        `context_token_budget`: None for the server's default, 0 for whole passages."""
        request = pb.QueryRequest(
            query=query,
            top_k=top_k,
            max_tokens=max_tokens,
            temperature=temperature,
            budget_ms=budget_ms,
            context_token_budget=context_token_budget,
        )
        call = self._stub.Query(request, timeout=timeout_s or self.default_timeout_s)
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()  # a consumer that stops early frees the server's generation at once

    async def info(self) -> pb.InfoResponse:
        response: pb.InfoResponse = await self._stub.Info(pb.InfoRequest(), timeout=self.default_timeout_s)
        return response
