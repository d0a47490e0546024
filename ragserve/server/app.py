"""Process wiring: bind, serve health and reflection, build the pipeline (which starts and stops its
own parts), hot reload, shut down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from starlette.routing import BaseRoute

from ragserve import tracing
from ragserve.config import Settings
from ragserve.errors import ConfigError, RagError
from ragserve.factory import make_index_watch, make_pipeline
from ragserve.generate.base import Generator
from ragserve.heap import freeze_start_up_heap
from ragserve.index.reload import IndexReloader
from ragserve.request.pipeline import RagPipeline
from ragserve.server.exposure import check_exposure, check_http_protected
from ragserve.server.front import Front
from ragserve.server.gate import SERVICE_NAME, CallGate
from ragserve.server.grpc.server import build_grpc_server
from ragserve.server.grpc.servicer import RagServicer
from ragserve.server.grpc.tls import CertificateReloader
from ragserve.server.http.app import http_app
from ragserve.server.http.listener import HttpListener
from ragserve.server.limiter import CallerLimits, InFlightLimiter
from ragserve.server.mcp.door import McpDoor
from ragserve.server.metrics_http import MetricsServer
from ragserve.server.openai.door import OpenAIDoor
from ragserve.server.page import page_routes
from ragserve.server.tls_files import TlsFiles
from ragserve.server.unix_socket import private_socket_path

log = logging.getLogger(__name__)

# Per-method health: Retrieve keeps serving when only the generator is down.
RETRIEVE_HEALTH_NAME = f"{SERVICE_NAME}/Retrieve"


def listen_address(settings: Settings) -> str:
    if settings.transport.uds_path:
        return f"unix:{settings.transport.uds_path}"
    return f"{settings.transport.host}:{settings.transport.port}"


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


def _tls_credentials(settings: Settings) -> grpc.ServerCredentials:
    # Re-read when the files change (rotation without a restart); a bad new pair keeps the current one.
    files = TlsFiles(settings.access.tls_cert_file, settings.access.tls_key_file, settings.access.tls_client_ca_file)
    return CertificateReloader(files).credentials


def bind(server: grpc.aio.Server, settings: Settings, address: str = "") -> str:
    """Add the listening port at `address` (default: the configured one); returns the configured one."""
    configured = listen_address(settings)
    address = address or configured
    try:
        if settings.access.tls_cert_file and settings.access.tls_key_file:
            port = server.add_secure_port(address, _tls_credentials(settings))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {configured}: the address is in use or not available") from exc
    if not settings.transport.uds_path and port == 0:
        raise ConfigError(f"cannot listen on {configured}: the address is in use or not available")
    return configured


def _check_port_free(host: str, port: int) -> None:
    """A port in use is said in one line of ours (gRPC's own refusal also prints a C-core log line)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server there? "
                "set RAGSERVE_PORT or --port)"
            ) from None


async def bind_and_start(server: grpc.aio.Server, settings: Settings) -> str:
    """A Unix socket appears at its path only once it is 0600 (server/unix_socket.py)."""
    if not settings.transport.uds_path:
        _check_port_free(settings.transport.host, settings.transport.port)
        address = bind(server, settings)
        await server.start()
        return address
    final = Path(settings.transport.uds_path)
    _clear_stale_socket(final)
    with private_socket_path(final) as bind_path:
        address = bind(server, settings, f"unix:{bind_path}")
        await server.start()  # inside: correct even if grpc binds only when the server starts
    return address


def call_gate(settings: Settings) -> CallGate:
    limits = settings.limits
    return CallGate(
        InFlightLimiter.from_settings(limits),
        InFlightLimiter(limits.max_side_streams, limits.overload_retry_after_ms),
        CallerLimits.from_settings(limits),
        limits.max_call_s,
    )


def make_front(settings: Settings, pipeline: RagPipeline | None = None) -> Front:
    """The front every door of one server shares (its gate from the settings); `pipeline`: None
    until loading finishes."""
    front = Front(settings, call_gate(settings))
    front.pipeline = pipeline
    return front


class RagServer:
    """The running service. `run()` serves until SIGTERM/SIGINT or `stop()`."""

    def __init__(self, settings: Settings) -> None:
        check_exposure(settings)
        if settings.observability.tracing_enabled:
            tracing.setup_tracing(settings.observability.tracing_otlp_endpoint)
        self.settings = settings
        self.pipeline: RagPipeline | None = None
        self._stop = asyncio.Event()
        self._owns_socket = False  # a server refused at start-up must not remove another's socket
        self._background: list[asyncio.Task[None]] = []
        self._metrics: MetricsServer | None = None
        # Every door over one front: the same identity, gate, request values and, once loaded, pipeline.
        self._front = make_front(settings)
        self._servicer = RagServicer(self._front)
        # The HTTP doors side by side on one listener (RAGSERVE_HTTP_PORT): the OpenAI door
        # (RAGSERVE_OPENAI_ENABLED) and the MCP door (RAGSERVE_MCP_ENABLED), each without the other.
        self._mcp = McpDoor(settings, self._front) if settings.mcp.enabled and settings.http.port else None
        self._http_routes: list[BaseRoute] = []
        if settings.http.port:
            check_http_protected(settings)
            openai = OpenAIDoor(settings, self._front).routes if settings.openai.enabled else []
            self._http_routes = [*openai, *(self._mcp.routes if self._mcp is not None else [])]
            self._http_routes += page_routes(self._front, settings)  # the page at /ui/ (RAGSERVE_PAGE_ENABLED)
        self._http: HttpListener | None = None
        self.server, self.health = build_grpc_server(settings, self._servicer)

    async def _set_health(self, status: int, names: tuple[str, ...] = ("", SERVICE_NAME, RETRIEVE_HEALTH_NAME)) -> None:
        for name in names:
            await self.health.set(name, status)

    async def start(self) -> str:
        """Bind and answer health checks (NOT_SERVING) at once, then load and warm everything."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = await bind_and_start(self.server, self.settings)
        self._owns_socket = bool(self.settings.transport.uds_path)
        observability = self.settings.observability
        if observability.metrics_port:
            self._metrics = MetricsServer(
                observability.metrics_host,
                observability.metrics_port,
                observability.metrics_max_connections,
                observability.metrics_timeout_s,
            )
            try:
                await self._metrics.start()
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {observability.metrics_host}:{observability.metrics_port} "
                    f"(RAGSERVE_METRICS_PORT): {exc}"
                ) from exc
        if self._http_routes:
            http = self.settings.http
            if self._mcp is not None:
                await self._mcp.start()
            app = http_app(self._http_routes, self._front.identity, http)
            self._http = HttpListener(app, http.host, http.port, self.settings)
            await self._http.start()
            paths = sorted({getattr(route, "path", "") for route in self._http_routes})
            log.info("HTTP listener on %s:%d (%s)", http.host, http.port, ", ".join(paths))
        log.info("listening on %s; loading models and index", address)
        loop = asyncio.get_running_loop()
        pipeline = await loop.run_in_executor(
            None, lambda: make_pipeline(self.settings, with_generator=self.settings.answer.generation_enabled)
        )
        try:
            await pipeline.astart()
        except BaseException:
            await pipeline.aclose()  # a part that started (the engine, a cache pool) is stopped again
            raise
        if pipeline.generator is not None:
            watch = self._watch_generator(pipeline.generator, rewarm=pipeline.warm_hot_passages)
            self._background.append(asyncio.create_task(watch))
        self.pipeline = pipeline
        self._front.pipeline = pipeline
        if self.settings.index.reload_interval_s > 0:
            self._background.append(asyncio.create_task(self._index_reloader(pipeline).run()))
        if pipeline.generator is not None:
            self._background.append(asyncio.create_task(self._save_counts(pipeline)))
        if self.settings.transport.freeze_start_up_heap:
            frozen, collect_s = freeze_start_up_heap()
            log.info("start-up heap: %d objects frozen after a %.2f s collection", frozen, collect_s)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving on %s (index version %s)", address, pipeline.index.version)
        if pipeline.generator is not None:
            # After SERVING, in the background: a person's first question never waits for warming.
            self._background.append(asyncio.create_task(_logged(pipeline.warm_hot_passages())))
        return address

    def _index_reloader(self, pipeline: RagPipeline) -> IndexReloader:
        """Hot reload: a newly published version is verified, then swapped in (see index/reload.py)."""
        return IndexReloader(
            make_index_watch(self.settings, pipeline),
            pipeline,
            interval_s=self.settings.index.reload_interval_s,
            after_swap=pipeline.warm_hot_passages,
        )

    async def _save_counts(self, pipeline: RagPipeline) -> None:
        """The retrieval counts warming reads at the next start, written now and then."""
        while True:
            await asyncio.sleep(self.settings.warming.hot_passages_save_s)
            await asyncio.to_thread(pipeline.save_counts)

    async def _watch_generator(
        self, generator: Generator, rewarm: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """A dead engine turns overall health NOT_SERVING; Retrieve's own health stays SERVING. A
        generation server that comes back has an empty prefix cache: `rewarm` runs again then."""
        healthy = True
        servers_up = _servers_up(generator)
        rewarming: asyncio.Task[None] | None = None
        try:
            while True:
                await asyncio.sleep(self.settings.observability.health_probe_interval_s)
                ok = await self._probe_generator(generator, healthy)
                if ok != healthy:
                    healthy = ok
                    status = (
                        health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
                    )
                    await self._set_health(status, ("", SERVICE_NAME))
                now_up = _servers_up(generator)
                back, servers_up = now_up - servers_up, now_up
                if back and rewarm is not None and (rewarming is None or rewarming.done()):
                    log.info(
                        "generation server(s) %s back: pre-filling the hot passages again", ", ".join(sorted(back))
                    )
                    rewarming = asyncio.create_task(_logged(rewarm()))  # probes go on meanwhile
        finally:
            if rewarming is not None:
                rewarming.cancel()

    async def _probe_generator(self, generator: Generator, healthy: bool) -> bool:
        try:
            async with asyncio.timeout(self.settings.observability.health_probe_timeout_s):
                await generator.check_health()
            return True
        except (RagError, TimeoutError) as exc:
            if healthy:
                log.error("generator unhealthy: %s", exc or "health probe timed out (RAGSERVE_HEALTH_PROBE_TIMEOUT_S)")
            return False
        except Exception:  # a bug or a peer's surprise fails this probe; the watcher goes on
            log.exception("the generator's health probe failed")
            return False

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
        log.info("shutting down (grace %.1f s)", self.settings.transport.shutdown_grace_s)
        await self.health.enter_graceful_shutdown()
        for task in self._background:
            task.cancel()
        closing = self._http.close() if self._http is not None else asyncio.sleep(0)
        await asyncio.gather(self.server.stop(self.settings.transport.shutdown_grace_s), closing)
        if self._mcp is not None:
            await self._mcp.close()
        if self._metrics is not None:
            await self._metrics.close()
        if self.pipeline is not None:
            await self.pipeline.aclose()
        if self._owns_socket:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.settings.transport.uds_path)
        log.info("stopped")


async def serve(settings: Settings) -> None:
    await RagServer(settings).run()


def _servers_up(generator: Generator) -> set[str]:
    """The URLs of a server pool's generation servers that are up (none for the engine in process)."""
    return {s.url for s in generator.status().servers if s.up}


async def _logged(work: Awaitable[object]) -> None:
    try:
        await work
    except Exception:  # a background step must not die silently, nor take the watcher with it
        log.exception("pre-filling the hot passages failed")
