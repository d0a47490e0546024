"""uvicorn's HTTP/1.1 protocol, bounded: a request's headers within RAGSERVE_HTTP_HEADER_TIMEOUT_S
of the connection's accept (its TLS handshake included) or of the request's first byte on a
kept-alive connection (uvicorn 0.54 has no such deadline: a client trickling a header, or sending
nothing, would hold its socket forever); a request's line and headers within MAX_HEAD_BYTES
(httptools sets no bound); a body the app never reads (the answer came first) within
RAGSERVE_HTTP_BODY_TIMEOUT_S. The verified client certificate's names go into the request's
state (uvicorn does not pass them on itself). Whether the connection is in a request (`busy`) is
what the listener's cap reads (server/http/listener.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ragserve.config import HttpSettings
from ragserve.server.http.errors import raw_response

# Most bytes in a request's line and headers; beyond, 431 and the connection closes. An OpenAI
# SDK's request head is well under 2 KiB; nginx's default bound is 32 KiB.
MAX_HEAD_BYTES = 64 * 1024


def certificate_names(cert: dict[str, Any] | None) -> set[str]:
    """A verified peer certificate's common name and subject alternative names (as gRPC reads them)."""
    if not cert:
        return set()
    names = {value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"}
    return names | {value for _, value in cert.get("subjectAltName", ())}


class DoorProtocol(HttpToolsProtocol):
    """The limits are class attributes: uvicorn builds the protocol itself (the listener subclasses
    it). `accepted_at` (the loop's clock) is set by the listener before the connection is made."""

    limits: ClassVar[HttpSettings]
    accepted_at: float | None = None
    busy = False  # a request's head is whole and its answer is not yet all out
    evicted = False  # closed by the listener to make room
    on_made: Callable[[], object] | None = None  # the listener's: a handshake became a connection
    _deadline: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.on_made is not None:
            self.on_made()
        since = self.accepted_at if self.accepted_at is not None else self.loop.time()
        self._arm(max(0.0, since + self.limits.header_timeout_s - self.loop.time()), headers=True)

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
        self.busy = True
        cert = self.transport.get_extra_info("peercert") if self.transport is not None else None
        self.scope["state"]["client_ids"] = certificate_names(cert)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self.cycle is not None and self.cycle.response_complete:
            self._disarm()  # an unread body (below) has arrived after all
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.busy = False
        super().on_response_complete()
        if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
            # Answered before its body was read (401, 404, 413...): the rest must still arrive in
            # time, or a trickled body would hold the connection past every other deadline.
            self._arm(self.limits.body_timeout_s, headers=False)

    def evict(self) -> None:
        """Closed at once, unanswered, to make room under the cap (the listener's choice)."""
        self.evicted = True
        self._disarm()
        if self.transport is not None:
            self.transport.abort()

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
            message = f"the request's headers did not arrive within {limit:g} s (RAGSERVE_HTTP_HEADER_TIMEOUT_S)"
            self.transport.write(raw_response(408, "Request Timeout", message, "invalid_request_error"))
        self.transport.close()
