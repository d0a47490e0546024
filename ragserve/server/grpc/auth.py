"""Who may call the gRPC port: the bearer-token and client-certificate interceptors (the rules are
server/identity.py's, the same on every door)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ragserve.errors import RagError
from ragserve.server.grpc.handlers import AroundCallInterceptor
from ragserve.server.grpc.status import to_status
from ragserve.server.identity import Identity


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
