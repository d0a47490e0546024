"""Who may connect: exposure rules for the listen address and one bearer-token interceptor."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ragserve.addresses import is_loopback
from ragserve.config import Settings
from ragserve.errors import ConfigError
from ragserve.server.handlers import AroundCallInterceptor


def check_exposure(settings: Settings) -> None:
    """A sidecar stays on loopback or a Unix socket unless the operator opts out AND protects it.

    Off loopback, TLS alone is not protection (any peer that trusts the server's certificate could
    call everything): callers must prove who they are, with a client certificate (mTLS) or a bearer
    token, and a token only travels inside TLS.
    """
    # RAGSERVE_TLS_ALLOWED_CLIENT_IDS without a client CA is refused by AccessSettings.
    if not (settings.transport.uds_path or is_loopback(settings.transport.host)):
        _check_protected(settings, settings.transport.host)
    if settings.openai.port and not is_loopback(settings.openai.host):  # the HTTP door: the same rules
        _check_protected(settings, settings.openai.host)


def _check_protected(settings: Settings, host: str) -> None:
    access = settings.access
    needs = (
        "TLS (RAGSERVE_TLS_CERT_FILE/RAGSERVE_TLS_KEY_FILE) with client certificates "
        "(RAGSERVE_TLS_CLIENT_CA_FILE) or a bearer token (RAGSERVE_AUTH_TOKEN)"
    )
    if not access.allow_non_loopback:
        raise ConfigError(f"refusing to listen on {host}: set RAGSERVE_ALLOW_NON_LOOPBACK=true with {needs}")
    has_tls = bool(access.tls_cert_file and access.tls_key_file)
    if not has_tls:
        raise ConfigError(
            f"listening on {host} needs {needs}; a bearer token over plaintext is readable on the network"
        )
    if not (access.tls_client_ca_file or access.auth_token):
        raise ConfigError(f"listening on {host} with TLS alone lets any peer in: it needs {needs}")


def _deny(message: str) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


def client_ids(context: grpc.aio.ServicerContext) -> set[str]:
    """The verified client certificate's common name and subject alternative names."""
    auth = context.auth_context() or {}
    names = [*auth.get("x509_common_name", []), *auth.get("x509_subject_alternative_name", [])]
    return {n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names}


class ClientIdentityInterceptor(AroundCallInterceptor):
    """mTLS pinning: every method, health and reflection included, only for certificates whose CN or
    a SAN is in RAGSERVE_TLS_ALLOWED_CLIENT_IDS (a certificate the CA signed is not enough)."""

    def __init__(self, allowed: frozenset[str]) -> None:
        if not allowed:
            raise ValueError("no allowed client ids")
        self._allowed = allowed

    @contextlib.asynccontextmanager
    async def around(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        # The same handler, refusing a caller whose certificate names none of the allowed ids.
        if not client_ids(context) & self._allowed:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "client certificate is not allowed")
        yield


class BearerTokenInterceptor(AroundCallInterceptor):
    """Every method, health and reflection included, needs `authorization: Bearer <token>`.

    The token is compared in constant time and never logged or echoed.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")
        self._expected = f"Bearer {token}".encode()
        self._deny = _deny("missing or invalid bearer token")

    def refuse(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        presented = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else value
                break
        return None if hmac.compare_digest(presented, self._expected) else self._deny

    def applies(self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler) -> bool:
        return False  # an admitted call runs as it is
