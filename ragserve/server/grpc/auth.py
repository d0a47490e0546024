"""Who may connect: exposure rules for the listen address and one bearer-token interceptor."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ragserve.addresses import is_loopback
from ragserve.config import Settings
from ragserve.errors import ConfigError, RagError
from ragserve.server.handlers import AroundCallInterceptor
from ragserve.server.identity import Identity
from ragserve.server.status import to_status


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
        "(RAGSERVE_TLS_CLIENT_CA_FILE), a bearer token (RAGSERVE_AUTH_TOKEN) or API keys (RAGSERVE_API_KEYS_FILE)"
    )
    if not access.allow_non_loopback:
        raise ConfigError(f"refusing to listen on {host}: set RAGSERVE_ALLOW_NON_LOOPBACK=true with {needs}")
    has_tls = bool(access.tls_cert_file and access.tls_key_file)
    if not has_tls:
        raise ConfigError(
            f"listening on {host} needs {needs}; a bearer token over plaintext is readable on the network"
        )
    if not (access.tls_client_ca_file or access.auth_token or access.api_keys_file):
        raise ConfigError(f"listening on {host} with TLS alone lets any peer in: it needs {needs}")


def _deny(error: RagError) -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort_with_status(to_status(error))

    return grpc.unary_unary_rpc_method_handler(abort)


def metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | bytes | None:
    """The first value of a metadata key the caller sent, None when it sent none."""
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value  # type: ignore[no-any-return]
    return None


def client_ids(context: grpc.aio.ServicerContext) -> set[str]:
    """The verified client certificate's common name and subject alternative names."""
    auth = context.auth_context() or {}
    names = [*auth.get("x509_common_name", []), *auth.get("x509_subject_alternative_name", [])]
    return {n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in names}


class ClientIdentityInterceptor(AroundCallInterceptor):
    """mTLS pinning: every method, health and reflection included, only for certificates whose CN or
    a SAN is in RAGSERVE_TLS_ALLOWED_CLIENT_IDS (a certificate the CA signed is not enough); the
    rule is server/identity.py's, the same on every door."""

    def __init__(self, identity: Identity) -> None:
        if not identity.allowed:
            raise ValueError("no allowed client ids")
        self._identity = identity

    @contextlib.asynccontextmanager
    async def around(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        # The same handler, refusing a caller whose certificate names none of the allowed ids.
        try:
            self._identity.check_certificate(client_ids(context))
        except RagError as error:
            await context.abort_with_status(to_status(error))
        yield


class BearerTokenInterceptor(AroundCallInterceptor):
    """Every method, health and reflection included, needs `authorization: Bearer <token or key>`,
    checked by server/identity.py (constant time, never logged or echoed) before the method is
    looked up."""

    def __init__(self, identity: Identity) -> None:
        if not identity.wants_credential:
            raise ValueError("no token or keys")
        self._identity = identity

    def refuse(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                presented = value
                break
        try:
            self._identity.key_name(presented)
        except RagError as error:
            return _deny(error)
        return None

    def applies(self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler) -> bool:
        return False  # an admitted call runs as it is
