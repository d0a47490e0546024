"""The HTTP listener's settings: one port for every HTTP door (the OpenAI-compatible door, the MCP
door, the page), its connections, their limits and deadlines. Variables use the RAGSERVE_HTTP_
prefix; those first named RAGSERVE_OPENAI_* are still read under that name (FORMER_PREFIX)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "RAGSERVE_HTTP_"
# The listener's settings lived on the OpenAI door; their old names still work.
FORMER_PREFIX = "RAGSERVE_OPENAI_"


def _named(field: str, default: Any, **bounds: Any) -> Any:
    """A field read from RAGSERVE_HTTP_<FIELD>, else its former RAGSERVE_OPENAI_<FIELD>."""
    names = AliasChoices(f"{PREFIX}{field.upper()}", f"{FORMER_PREFIX}{field.upper()}")
    return Field(default=default, validation_alias=names, **bounds)


class HttpSettings(BaseSettings):
    """The HTTP listener every HTTP door stands on (docs/api.md). Off while `port` is 0. A variable
    that was first named RAGSERVE_OPENAI_* (RAGSERVE_OPENAI_PORT...) is still read under that name."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True, populate_by_name=True)

    # Its own TCP port (0: off). It serves the same pipeline as the gRPC port, in the same process.
    port: int = _named("port", 0, ge=0, le=65535)
    # Its address. Off loopback, the same rules as the gRPC port (RAGSERVE_ALLOW_NON_LOOPBACK with
    # TLS and client certificates or a bearer token); the same TLS files and token apply.
    host: str = _named("host", "127.0.0.1")
    # Most bytes in a request body; beyond, 413 (a history at its bounds fits well within it).
    max_body_bytes: int = _named("max_body_bytes", 1_048_576, ge=1024)
    # Host names a request's Host header may carry besides the listener's own (its address, the
    # address the connection came in on, and `localhost` on loopback), comma-separated, any port:
    # a reverse proxy's or a container's name. Any other is refused (421): a web page whose DNS name
    # was rebound to this address sends its own name, and cannot read answers through the browser.
    allowed_hosts: str = _named("allowed_hosts", "")
    # Origins (scheme://host[:port]) a browser's request to the MCP door may carry besides the
    # listener's own host, comma-separated; any other Origin is refused (403, as the MCP transport
    # asks against DNS rebinding). A request with no Origin (not a browser) passes.
    allowed_origins: str = ""
    # Connections open at once, TLS handshakes included. At the cap, a new connection closes the
    # oldest one that is in no request (a handshake, a request's head not yet whole, an idle
    # keep-alive); when every one is in a request, the new one is answered 503 and closed. Sockets
    # are file descriptors the gRPC port shares. Above RAGSERVE_MAX_IN_FLIGHT (64), for the idle
    # connections clients keep in their pools.
    max_connections: int = _named("max_connections", 128, ge=1)
    # Requests one caller (its key, token or certificate names) may have open at once on the
    # listener, from its headers to its answer's last byte, a body still arriving included; one more
    # is answered 429 and its connection closed. Keeps one caller's slow bodies from taking every
    # connection (the cap above) from the others.
    max_requests_per_caller: int = Field(default=32, ge=1)
    # Seconds a connection may take from its accept to a request's whole headers (the TLS handshake
    # included), and a kept-alive connection from a request's first byte; then 408 and the
    # connection closes: a client trickling bytes (slowloris), or sending none, holds its socket
    # that long at most.
    header_timeout_s: float = _named("header_timeout_s", 10.0, gt=0)
    # Seconds a request's body may take after its headers; then 408 and the connection closes.
    body_timeout_s: float = _named("body_timeout_s", 30.0, gt=0)
    # Seconds a connection may stay idle between requests (uvicorn's keep-alive timeout).
    keep_alive_s: int = _named("keep_alive_s", 5, ge=1)

    @property
    def allowed_host_names(self) -> frozenset[str]:
        return frozenset(name.strip().lower() for name in self.allowed_hosts.split(",") if name.strip())

    @property
    def allowed_origin_names(self) -> frozenset[str]:
        return frozenset(name.strip().lower().rstrip("/") for name in self.allowed_origins.split(",") if name.strip())
