"""What a request's head must name: a Host this listener answers to (every HTTP door: 421), and on
the doors that ask it, an Origin of this host or a configured one (MCP: 403). A web page whose DNS
name was rebound to this address sends its own name in both."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ragserve.addresses import is_loopback
from ragserve.server.http.errors import error_body, json_response


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
    `localhost` on loopback and RAGSERVE_HTTP_ALLOWED_HOSTS, any port. A page whose DNS name was
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
            return json_response(400, error_body("one Host header is required", "invalid_request_error", "host"))
        name = host_name(given[0].decode("latin-1"))
        local = host_name(str((scope.get("server") or ("",))[0]))
        if name and (name in self._names or name == local or (name == "localhost" and is_loopback(local))):
            return None
        message = f"this server does not answer to the host {name[:100]!r} (RAGSERVE_HTTP_ALLOWED_HOSTS)"
        return json_response(421, error_body(message, "invalid_request_error", "host", "misdirected_request"))


def origin_refusal(scope: Scope, allowed: frozenset[str]) -> Response | None:
    """None when the request carries no Origin (no browser), an Origin whose host is the request's
    own Host, or one of `allowed` (scheme://host[:port], RAGSERVE_HTTP_ALLOWED_ORIGINS); else 403."""
    origins = [value.decode("latin-1") for key, value in scope.get("headers", ()) if key == b"origin"]
    if not origins:
        return None
    origin = origins[0].strip().lower().rstrip("/")
    hosts = [value.decode("latin-1") for key, value in scope.get("headers", ()) if key == b"host"]
    try:
        parts = urlsplit(origin)
        named = host_name(parts.netloc) if parts.scheme in ("http", "https") else ""
    except ValueError:
        named = ""
    if origin in allowed or (named and hosts and named == host_name(hosts[0])):
        return None
    message = f"this server does not answer to pages from {origin[:100]!r} (RAGSERVE_HTTP_ALLOWED_ORIGINS)"
    return json_response(403, error_body(message, "permission_error", "origin", "forbidden_origin"))
