"""An ASGI app served by uvicorn inside this process, on the running event loop: its own socket
(bound here, so a busy port is our one-line ConfigError), the gRPC port's TLS files (followed when
they rotate, as on the gRPC port), and the verified client certificate's names handed to the app
(uvicorn does not pass them on itself).

Its sockets share the process's file descriptors with the gRPC port, so a connection costs a
bounded while: at most RAGSERVE_OPENAI_MAX_CONNECTIONS are open (one more is answered 503 and
closed at once), and a request's headers must arrive within RAGSERVE_OPENAI_HEADER_TIMEOUT_S of
the connection or the request's first byte (uvicorn 0.54 has no such deadline: a client trickling
a header, or sending nothing, would hold its socket forever), and a request's line and headers
must fit in MAX_HEAD_BYTES (httptools sets no bound: uvicorn would keep megabytes of headers). A
body the app reads has the app's deadline; one it never reads (the answer came first) gets
RAGSERVE_OPENAI_BODY_TIMEOUT_S here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any, ClassVar

import orjson
import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ragserve.addresses import is_loopback
from ragserve.config import OpenAISettings, Settings
from ragserve.errors import ConfigError
from ragserve.server.openai_wire import error_body
from ragserve.server.tls import TlsFiles, files_state, load_certificate_configuration

log = logging.getLogger(__name__)

# How often the HTTP door looks at its TLS files (a rotated certificate is served within this).
TLS_CHECK_S = 2.0

# Most bytes in a request's line and headers; beyond, 431 and the connection closes. An OpenAI
# SDK's request head is well under 2 KiB; nginx's default bound is 32 KiB.
MAX_HEAD_BYTES = 64 * 1024


def certificate_names(cert: dict[str, Any] | None) -> set[str]:
    """A verified peer certificate's common name and subject alternative names (as gRPC reads them)."""
    if not cert:
        return set()
    names = {value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"}
    return names | {value for _, value in cert.get("subjectAltName", ())}


def raw_response(status: int, reason: str, message: str, kind: str) -> bytes:
    """A whole HTTP/1.1 answer with an OpenAI error body that closes the connection, written
    straight to the socket (before or outside any ASGI call)."""
    body = orjson.dumps(error_body(message, kind))
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


class DoorProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the caller's certificate names in the request's state, a
    cap on open connections, and a deadline and a size bound on each request's headers. The limits
    are class attributes: uvicorn builds the protocol itself (`HttpListener` subclasses it)."""

    limits: ClassVar[OpenAISettings]
    _deadline: asyncio.TimerHandle | None = None
    _refused = False
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refused = True
            self.connections.discard(self)  # a refused socket takes no place under the cap
            message = f"over {self.limits.max_connections} open connections (RAGSERVE_OPENAI_MAX_CONNECTIONS)"
            transport.write(raw_response(503, "Service Unavailable", message, "service_unavailable"))
            transport.close()
            return
        self._arm(self.limits.header_timeout_s, headers=True)

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # what a refused connection sends is never parsed
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._deadline is None:  # the next request on a kept-alive connection: its own deadline
            self._arm(self.limits.header_timeout_s, headers=True)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too long")  # the parser stops; uvicorn answers below

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes <= MAX_HEAD_BYTES:
            super().send_400_response(msg)
            return
        message = f"the request's line and headers are over {MAX_HEAD_BYTES} bytes"
        self.transport.write(raw_response(431, "Request Header Fields Too Large", message, "invalid_request_error"))
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()  # the body's deadline is the app's, which answers 408 itself
        cert = self.transport.get_extra_info("peercert") if self.transport is not None else None
        self.scope["state"]["client_ids"] = certificate_names(cert)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self.cycle is not None and self.cycle.response_complete:
            self._disarm()  # an unread body (below) has arrived after all
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
            # Answered before its body was read (401, 404, 413...): the rest must still arrive in
            # time, or a trickled body would hold the connection past every other deadline.
            self._arm(self.limits.body_timeout_s, headers=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, *, headers: bool) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, headers)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, headers: bool) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete  # no answer is being written
        if headers and idle and self.scope is not None:  # a request had begun: say why it ends
            limit = self.limits.header_timeout_s
            message = f"the request's headers did not arrive within {limit:g} s (RAGSERVE_OPENAI_HEADER_TIMEOUT_S)"
            self.transport.write(raw_response(408, "Request Timeout", message, "invalid_request_error"))
        self.transport.close()


def host_name(value: str) -> str:
    """A Host header's (or an address's) name: lower case, without its port, an IP literal in its
    one spelling; "" when it is no host."""
    value = value.strip().lower()
    port = ""
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return ""
        port = rest[1:]
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name = value  # a bare name, or an IPv6 address as a socket gives it
    if port and not port.isdigit():
        return ""
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


class HostCheck:
    """Only Host names this door answers to: its address, the address the connection came in on,
    `localhost` on loopback and RAGSERVE_OPENAI_ALLOWED_HOSTS, any port. A page whose DNS name was
    rebound to this address sends its own name, so a browser cannot carry its calls here."""

    def __init__(self, app: ASGIApp, host: str, allowed: frozenset[str]) -> None:
        self._app = app
        names = {host_name(host), *(host_name(name) for name in allowed)}
        self._names = frozenset(names - {""})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self._app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        given = [value for key, value in scope["headers"] if key == b"host"]
        if len(given) != 1:
            return _json_response(400, error_body("one Host header is required", "invalid_request_error", "host"))
        name = host_name(given[0].decode("latin-1"))
        local = host_name(str((scope.get("server") or ("",))[0]))
        if name and (name in self._names or name == local or (name == "localhost" and is_loopback(local))):
            return None
        message = f"this server does not answer to the host {name[:100]!r} (RAGSERVE_OPENAI_ALLOWED_HOSTS)"
        return _json_response(421, error_body(message, "invalid_request_error", "host", "misdirected_request"))


def _json_response(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


async def follow_tls_files(context: ssl.SSLContext, files: TlsFiles) -> None:
    """Certificate rotation without a restart, as on the gRPC port (server/tls.py): the files are
    looked at every TLS_CHECK_S, and a changed set that passes the same checks is loaded into the
    listener's context, so new connections get it; a broken set keeps the current certificate. A
    new client CA is trusted beside the old one until a restart (OpenSSL adds, never removes)."""
    seen = files_state(files.paths())
    while True:
        await asyncio.sleep(TLS_CHECK_S)
        state = files_state(files.paths())
        if state == seen:
            continue
        seen = state
        try:
            load_certificate_configuration(files)  # readable, PEM, and the key matches the certificate
            context.load_cert_chain(files.cert_file, files.key_file)
            if files.client_ca_file:
                context.load_verify_locations(files.client_ca_file)
        except (ConfigError, OSError, ssl.SSLError) as exc:
            log.warning("the HTTP door keeps its current TLS certificate: %s", exc)
            continue
        log.info("the HTTP door serves the new TLS certificate from %s", files.cert_file)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gRPC server's process owns SIGTERM and SIGINT and stops this one itself


class HttpListener:
    def __init__(self, app: ASGIApp, host: str, port: int, settings: Settings) -> None:
        self._app = HostCheck(app, host, settings.openai.allowed_host_names)
        self._host = host
        self._port = port
        self._settings = settings
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._rotation: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = self._bind()
        access = self._settings.access
        tls = bool(access.tls_cert_file and access.tls_key_file)
        protocol = type("ListenerProtocol", (DoorProtocol,), {"limits": self._settings.openai})
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,  # the server's own logging (ragserve/logs.py) is already set up
            access_log=False,  # the door logs each call itself, without its text
            http=protocol,
            ws="none",  # no WebSocket route: an upgrade would leave DoorProtocol's bounds behind
            timeout_keep_alive=self._settings.openai.keep_alive_s,
            ssl_certfile=access.tls_cert_file if tls else None,
            ssl_keyfile=access.tls_key_file if tls else None,
            ssl_ca_certs=access.tls_client_ca_file if tls and access.tls_client_ca_file else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls and access.tls_client_ca_file else ssl.CERT_NONE,
            timeout_graceful_shutdown=max(1, round(self._settings.transport.shutdown_grace_s)),
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # its failure, raised here
                raise ConfigError(f"the HTTP door on {self._host}:{self._port} stopped while starting")
            await asyncio.sleep(0.01)
        if tls and config.ssl is not None:
            files = TlsFiles(access.tls_cert_file, access.tls_key_file, access.tls_client_ca_file)
            self._rotation = asyncio.create_task(follow_tls_files(config.ssl, files))

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
                f"cannot serve the OpenAI-compatible door on {self._host}:{self._port} (RAGSERVE_OPENAI_PORT): "
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
