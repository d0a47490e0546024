"""An ASGI app served by uvicorn inside this process, on the running event loop: its own socket
(bound here, so a busy port is our one-line ConfigError), the gRPC port's TLS files, and the
verified client certificate's names handed to the app (uvicorn does not pass them on itself)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ragserve.config import Settings
from ragserve.errors import ConfigError


def certificate_names(cert: dict[str, Any] | None) -> set[str]:
    """A verified peer certificate's common name and subject alternative names (as gRPC reads them)."""
    if not cert:
        return set()
    names = {value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"}
    return names | {value for _, value in cert.get("subjectAltName", ())}


class _PeerNamesProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, putting the caller's certificate names in the request's state."""

    def on_headers_complete(self) -> None:
        cert = self.transport.get_extra_info("peercert") if self.transport is not None else None
        self.scope["state"]["client_ids"] = certificate_names(cert)
        super().on_headers_complete()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the gRPC server's process owns SIGTERM and SIGINT and stops this one itself


class HttpListener:
    def __init__(self, app: ASGIApp, host: str, port: int, settings: Settings) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._settings = settings
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sock = self._bind()
        access = self._settings.access
        tls = bool(access.tls_cert_file and access.tls_key_file)
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,  # the server's own logging (ragserve/logs.py) is already set up
            access_log=False,  # the door logs each call itself, without its text
            http=_PeerNamesProtocol,
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

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
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
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        await self._task
