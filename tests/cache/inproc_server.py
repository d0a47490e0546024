"""The real gRPC servicer on a loopback port, in this process, without the generator.

Retrieve needs no vLLM engine, so cache tests and the cache benchmark drive the server-level path
(validation, Deadline, pipeline, conversion) without a minute of engine start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from ragserve.config import Settings
from ragserve.limiter import InFlightLimiter
from ragserve.pipeline import RagPipeline
from ragserve.server.servicer import RagServicer
from ragserve.v1 import rag_pb2_grpc as pb_grpc


@asynccontextmanager
async def serve_pipeline(pipeline: RagPipeline, settings: Settings | None = None) -> AsyncIterator[str]:
    """Yields the target ("127.0.0.1:<port>"); stops the server on exit."""
    settings = settings or Settings(generation_enabled=False)
    server = grpc.aio.server()
    pb_grpc.add_RagServiceServicer_to_server(
        RagServicer(settings, InFlightLimiter(settings.max_in_flight), pipeline), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
