"""The real gRPC servicer on a loopback port, in this process, without the generator.

Retrieve needs no vLLM engine, so cache tests and the cache benchmark drive the server-level path
(validation, Deadline, pipeline, conversion) without a minute of engine start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ragserve.config import Settings
from ragserve.request.pipeline import RagPipeline
from ragserve.server.app import build_grpc_server
from ragserve.server.limiter import InFlightLimiter
from ragserve.server.servicer import RagServicer


@asynccontextmanager
async def serve_pipeline(pipeline: RagPipeline, settings: Settings | None = None) -> AsyncIterator[str]:
    """Yields the target ("127.0.0.1:<port>"); stops the server on exit."""
    settings = settings or Settings(generation_enabled=False)
    # The production wiring: server options, interceptors, health and reflection.
    server, _ = build_grpc_server(
        settings, RagServicer(settings, InFlightLimiter(settings.limits.max_in_flight), pipeline)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
