"""The gRPC door's server: its options, its interceptors (the credential, pinned certificates, the
call gate's bound on side streams), RagService, health and reflection; not bound (server/app.py
binds and starts it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragserve.config import Settings
from ragserve.errors import Overloaded
from ragserve.server.gate import SERVICE_NAME, CallGate
from ragserve.server.grpc.auth import BearerTokenInterceptor, ClientIdentityInterceptor
from ragserve.server.grpc.handlers import AroundCallInterceptor
from ragserve.server.grpc.servicer import RagServicer
from ragserve.server.grpc.status import to_status
from ragserve.v1 import rag_pb2_grpc as pb_grpc


def server_options(settings: Settings) -> list[tuple[str, int]]:
    # max_concurrent_streams >= max_in_flight + max_side_streams is checked by Settings.
    options = [
        # A second server on the same port must fail to bind, not silently share it.
        ("grpc.so_reuseport", 0),
        # Also bounds a compressed request by its decompressed size (RESOURCE_EXHAUSTED, no bomb).
        ("grpc.max_receive_message_length", settings.transport.max_message_bytes),
        ("grpc.max_send_message_length", settings.transport.max_message_bytes),
        ("grpc.max_concurrent_streams", settings.transport.max_concurrent_streams),
        # Long-lived sidecar channels: the server pings idle connections and lets clients ping
        # as often as keepalive_min_ping_ms, even between calls, without a GOAWAY.
        ("grpc.keepalive_time_ms", settings.transport.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.transport.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", settings.transport.keepalive_min_ping_ms),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if settings.transport.max_connection_idle_ms > 0:
        options.append(("grpc.max_connection_idle_ms", settings.transport.max_connection_idle_ms))
    if settings.transport.max_connection_age_ms > 0:
        options.append(("grpc.max_connection_age_ms", settings.transport.max_connection_age_ms))
        options.append(("grpc.max_connection_age_grace_ms", settings.transport.max_connection_age_grace_ms))
    return options


class SideStreams(AroundCallInterceptor):
    """The call gate's bound on streams other than RagService's (health Watch, reflection).
    Unary health checks answer at once from memory and need none; RagService's own methods pass
    the gate in the servicer."""

    def __init__(self, gate: CallGate) -> None:
        self._gate = gate

    def applies(self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler) -> bool:
        streaming = bool(handler.request_streaming or handler.response_streaming)
        return streaming and not details.method.startswith(f"/{SERVICE_NAME}/")

    @contextlib.asynccontextmanager
    async def around(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        with contextlib.ExitStack() as slot:
            try:
                slot.enter_context(self._gate.side_stream())
            except Overloaded as error:
                await context.abort_with_status(to_status(error))
            yield


def build_grpc_server(settings: Settings, servicer: RagServicer) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The gRPC server with its options, interceptors, RagService, health and reflection (not bound)."""
    front = servicer.front
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if front.identity.wants_credential:
        interceptors.append(BearerTokenInterceptor(front.identity))
    if front.identity.allowed:
        interceptors.append(ClientIdentityInterceptor(front.identity))
    interceptors.append(SideStreams(front.gate))
    server = grpc.aio.server(options=server_options(settings), interceptors=interceptors)
    health_servicer = health.aio.HealthServicer()
    pb_grpc.add_RagServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return server, health_servicer
