"""Who may connect: exposure rules for the listen address and one bearer-token interceptor."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ragserve.config import Settings
from ragserve.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> None:
    """A sidecar stays on loopback or a Unix socket unless the operator opts out AND protects it."""
    if settings.uds_path or is_loopback(settings.host):
        return
    if not settings.allow_non_loopback:
        raise ConfigError(
            f"refusing to listen on {settings.host}: set RAGSERVE_ALLOW_NON_LOOPBACK=true together with "
            "TLS (RAGSERVE_TLS_CERT_FILE/RAGSERVE_TLS_KEY_FILE) or RAGSERVE_AUTH_TOKEN"
        )
    has_tls = bool(settings.tls_cert_file and settings.tls_key_file)
    if not (has_tls or settings.auth_token):
        raise ConfigError(
            f"listening on {settings.host} needs TLS (RAGSERVE_TLS_CERT_FILE/RAGSERVE_TLS_KEY_FILE) "
            "or a bearer token (RAGSERVE_AUTH_TOKEN)"
        )


def _deny(message: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method, health and reflection included, needs `authorization: Bearer <token>`.

    The token is compared in constant time and never logged or echoed.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")
        self._expected = f"Bearer {token}".encode()
        self._deny = _deny("missing or invalid bearer token")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else value
                break
        if hmac.compare_digest(presented, self._expected):
            return await continuation(handler_call_details)
        return self._deny
