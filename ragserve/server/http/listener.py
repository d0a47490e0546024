"""The HTTP listener every HTTP door stands on: an ASGI app served by uvicorn inside this process,
on the running event loop, from a socket bound here (a busy port is our one-line ConfigError).

Its sockets share the process's file descriptors with the gRPC port, so a connection costs a
bounded while. The listener accepts connections itself (uvicorn serves them once made), so every
one is counted from its accept, its TLS handshake included: at most RAGSERVE_HTTP_MAX_CONNECTIONS
are open. At the cap a new connection closes the oldest one in no request (a handshake, a head not
yet whole, an idle keep-alive: one caller's silent sockets cannot lock the others out); when every
one is in a request (server/http/app.py bounds those per caller), the new one is answered 503 (or,
under TLS, closed). A TLS handshake must end within RAGSERVE_HTTP_HEADER_TIMEOUT_S (asyncio's
default is 60 s), and the request's headers within the same time of the accept
(server/http/protocol.py).

TLS: the gRPC port's files (RAGSERVE_TLS_*), checked by server/tls_files.py and looked at every
TLS_CHECK_S; a changed set that passes is loaded into a new context for new connections, so a
rotated certificate is served, and a client CA removed from the file is no longer trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from ragserve.config import HttpSettings, Settings
from ragserve.errors import ConfigError
from ragserve.server.http.errors import raw_response
from ragserve.server.http.host import HostCheck
from ragserve.server.http.protocol import DoorProtocol
from ragserve.server.tls_files import TlsFiles, files_state, read_checked

log = logging.getLogger(__name__)

# How often the listener looks at its TLS files (a rotated certificate is served within this).
TLS_CHECK_S = 2.0


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from checked files; client certificates required when there is a CA."""
    read_checked(files)  # readable, PEM, and the key matches the certificate: else ConfigError
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert_file, files.key_file)
    if files.client_ca_file:
        context.load_verify_locations(files.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _closing(made: object) -> bool:
    transport = getattr(made, "transport", None)
    return transport is None or transport.is_closing()


class Acceptor:
    """Accepts on the listener's socket, counts every connection from its accept (handshakes
    included), closes the oldest idle one at the cap, and hands the rest to uvicorn's protocol."""

    def __init__(
        self, sock: socket.socket, make: Callable[[], DoorProtocol], state: ServerState, limits: HttpSettings
    ) -> None:
        self.context: ssl.SSLContext | None = None  # swapped whole when the TLS files change
        self._sock = sock
        self._make = make
        self._state = state
        self._limits = limits
        self._handshakes: dict[asyncio.Task[None], float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sock.setblocking(False)
        self._sock.listen(2048)
        self._task = asyncio.create_task(self._accept())

    def open_count(self) -> int:
        """Handshakes and connections, less those closed here (gone at the next loop turn)."""
        live = [made for made in self._state.connections if not getattr(made, "evicted", False)]
        return len(self._handshakes) + len(live)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors, a reset before accept: keep serving
                log.warning("the HTTP listener could not accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._admit(conn, loop.time())
            await asyncio.sleep(0)  # an accept that needs no wait does not yield: let the rest run

    def _admit(self, conn: socket.socket, now: float) -> None:
        if self.open_count() >= self._limits.max_connections and not self._close_oldest_idle():
            self._refuse(conn)
            return
        task = asyncio.create_task(self._connect(conn, now))
        self._handshakes[task] = now
        task.add_done_callback(lambda done: self._handshakes.pop(done, None))

    async def _connect(self, conn: socket.socket, accepted_at: float) -> None:
        connecting = asyncio.current_task()  # the factory runs in this task, before any handshake

        def protocol() -> DoorProtocol:
            made = self._make()
            made.accepted_at = accepted_at
            # Made: counted among the connections from now on, no more as a handshake.
            made.on_made = lambda: self._handshakes.pop(connecting, None)  # type: ignore[arg-type]
            return made

        loop = asyncio.get_running_loop()
        timeout = self._limits.header_timeout_s if self.context is not None else None
        try:
            await loop.connect_accepted_socket(
                protocol, conn, ssl=self.context, ssl_handshake_timeout=timeout, ssl_shutdown_timeout=timeout
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:  # asyncio has closed it
            log.debug("an HTTP connection ended in its TLS handshake: %s", exc)

    def _close_oldest_idle(self) -> bool:
        """Close the oldest connection in no request; False when every one is in a request."""
        idle: list[tuple[float, Callable[[], object]]] = [
            (since, functools.partial(self._cancel, task)) for task, since in self._handshakes.items()
        ]
        for made in self._state.connections:
            if isinstance(made, DoorProtocol) and not made.evicted and (_closing(made) or not made.busy):
                # One already closing (a TLS goodbye after its answer) goes first.
                idle.append((-1.0 if _closing(made) else made.accepted_at or 0.0, made.evict))
        if not idle:
            return False
        min(idle, key=lambda pair: pair[0])[1]()
        return True

    def _cancel(self, task: asyncio.Task[None]) -> None:
        self._handshakes.pop(task, None)  # counted no more: asyncio aborts it at the next loop turn
        task.cancel()

    def _refuse(self, conn: socket.socket) -> None:
        if self.context is None:  # plaintext: say why; under TLS nothing can be said before a handshake
            cap = self._limits.max_connections
            message = f"{cap} connections are in requests (RAGSERVE_HTTP_MAX_CONNECTIONS)"
            with contextlib.suppress(OSError):
                conn.send(raw_response(503, "Service Unavailable", message, "service_unavailable"))
        conn.close()

    def close(self) -> None:
        """What uvicorn's shutdown calls on its servers: no new connections, no handshakes."""
        for task in [self._task, *self._handshakes]:
            if task is not None:
                task.cancel()

    async def wait_closed(self) -> None:
        return None


async def follow_tls_files(acceptor: Acceptor, files: TlsFiles) -> None:
    """Certificate rotation without a restart, as on the gRPC port (server/grpc/tls.py): the files
    are looked at every TLS_CHECK_S, and a changed set that passes the same checks becomes a new
    context for new connections; a broken set keeps the current one."""
    seen = files_state(files.paths())
    while True:
        await asyncio.sleep(TLS_CHECK_S)
        state = files_state(files.paths())
        if state == seen:
            continue
        seen = state
        try:
            acceptor.context = tls_context(files)
        except (ConfigError, OSError, ssl.SSLError) as exc:
            log.warning("the HTTP listener keeps its current TLS certificate: %s", exc)
            continue
        log.info("the HTTP listener serves the new TLS certificate from %s", files.cert_file)


class _Server(uvicorn.Server):
    """uvicorn's server, serving the connections the listener's Acceptor makes."""

    def __init__(self, config: uvicorn.Config, limits: HttpSettings, context: ssl.SSLContext | None) -> None:
        super().__init__(config)
        self._limits = limits
        self._context = context
        self.acceptor: Acceptor | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        assert sockets, "the listener binds its own socket"
        config = self.config

        def make() -> DoorProtocol:
            made = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            assert isinstance(made, DoorProtocol)
            return made

        self.acceptor = Acceptor(sockets[0], make, self.server_state, self._limits)
        self.acceptor.context = self._context
        self.acceptor.start()
        self.servers = [self.acceptor]  # type: ignore[list-item]  # closed by uvicorn's shutdown
        self.started = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gRPC server's process owns SIGTERM and SIGINT and stops this one itself


class HttpListener:
    def __init__(self, app: ASGIApp, host: str, port: int, settings: Settings) -> None:
        self._app = HostCheck(app, host, settings.http.allowed_host_names)
        self._host = host
        self._port = port
        self._settings = settings
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._rotation: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = self._bind()
        access = self._settings.access
        files = None
        if access.tls_cert_file and access.tls_key_file:
            files = TlsFiles(access.tls_cert_file, access.tls_key_file, access.tls_client_ca_file)
        context = tls_context(files) if files is not None else None
        protocol = type("ListenerProtocol", (DoorProtocol,), {"limits": self._settings.http})
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,  # the server's own logging (ragserve/logs.py) is already set up
            access_log=False,  # the door logs each call itself, without its text
            http=protocol,
            ws="none",  # no WebSocket route: an upgrade would leave DoorProtocol's bounds behind
            timeout_keep_alive=self._settings.http.keep_alive_s,
            timeout_graceful_shutdown=max(1, round(self._settings.transport.shutdown_grace_s)),
        )
        self._server = _Server(config, self._settings.http, context)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # its failure, raised here
                raise ConfigError(f"the HTTP listener on {self._host}:{self._port} stopped while starting")
            await asyncio.sleep(0.01)
        if files is not None and self._server.acceptor is not None:
            self._rotation = asyncio.create_task(follow_tls_files(self._server.acceptor, files))

    def open_connections(self) -> int:
        """Connections open now, handshakes included (what the cap counts)."""
        acceptor = self._server.acceptor if self._server is not None else None
        return acceptor.open_count() if acceptor is not None else 0

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        # Inherited by every accepted connection. Without it, each request after the first on a
        # kept-alive connection waited ~40 ms for the client's delayed ACK before its answer went
        # out (Nagle), on uvicorn 0.54 over this socket: measured in BENCHMARKS.md, "The MCP door".
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"cannot serve the HTTP listener on {self._host}:{self._port} (RAGSERVE_HTTP_PORT): "
                f"{exc.strerror or exc}"
            ) from None
        sock.set_inheritable(True)
        return sock

    async def close(self) -> None:
        """In-flight calls get the shutdown grace period, then the connections close."""
        if self._rotation is not None:
            self._rotation.cancel()
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
