"""Process wiring: load the parts, bind, serve health and reflection, shut down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragserve.config import Settings
from ragserve.errors import ConfigError
from ragserve.factory import make_pipeline
from ragserve.limiter import InFlightLimiter
from ragserve.pipeline import RagPipeline
from ragserve.server.servicer import RagServicer
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RagService"].full_name
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

SERVER_OPTIONS = [
    # A second server on the same port must fail to bind, not silently share it.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Long-lived sidecar channels: allow client pings every 10 s, even between calls.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def listen_address(settings: Settings) -> str:
    if settings.uds_path:
        return f"unix:{settings.uds_path}"
    return f"{settings.host}:{settings.port}"


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file left by a dead server; refuse if a live server still answers on it."""
    if not path.exists():
        return
    if not stat.S_ISSOCK(path.stat().st_mode):
        raise ConfigError(f"RAGSERVE_UDS_PATH {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise ConfigError(f"another server is already listening on {path}")


def bind(server: grpc.aio.Server, settings: Settings) -> str:
    address = listen_address(settings)
    if settings.uds_path:
        _clear_stale_socket(Path(settings.uds_path))
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {address}: the address is in use or not available") from exc
    if not settings.uds_path and port == 0:
        raise ConfigError(f"cannot listen on {address}: the address is in use or not available")
    if settings.uds_path:
        os.chmod(settings.uds_path, 0o600)  # only this user (the app container's) may connect
    return address


class RagServer:
    """The running service. `run()` serves until SIGTERM/SIGINT or `stop()`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.health = health.aio.HealthServicer()
        self.pipeline: RagPipeline | None = None
        self._stop = asyncio.Event()
        self._servicer = RagServicer(settings, InFlightLimiter(settings.max_in_flight))
        pb_grpc.add_RagServiceServicer_to_server(self._servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def start(self) -> str:
        """Bind and answer health checks (NOT_SERVING) at once, then load and warm everything."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = bind(self.server, self.settings)
        await self.server.start()
        log.info("listening on %s; loading models and index", address)
        loop = asyncio.get_running_loop()
        pipeline = await loop.run_in_executor(None, make_pipeline, self.settings)
        await loop.run_in_executor(None, pipeline.embedder.embed_queries, ["warm-up"])
        if pipeline.generator is not None:
            await pipeline.generator.start()
        self.pipeline = pipeline
        self._servicer.pipeline = pipeline
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s (index version %s)", address, pipeline.index.version)
        return address

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.start()
            await self._stop.wait()
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Health turns NOT_SERVING at once; new calls are refused; in-flight calls get the grace period."""
        log.info("shutting down (grace %.1f s)", self.settings.shutdown_grace_s)
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.shutdown_grace_s)
        if self.pipeline is not None and self.pipeline.generator is not None:
            await self.pipeline.generator.close()
        if self.settings.uds_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.settings.uds_path)
        log.info("stopped")


async def serve(settings: Settings) -> None:
    await RagServer(settings).run()
