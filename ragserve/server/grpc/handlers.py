"""Running code around every call of a gRPC method handler (a check, a bound), whatever its shape."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

# Entered before the method runs and left when it has finished (streams included).
AroundCall = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]


def wrap_handler(handler: grpc.RpcMethodHandler, around: AroundCall) -> grpc.RpcMethodHandler:
    """The same method, run inside `around(context)`.

    A streaming method may be an async generator (yields responses) or a coroutine that writes them
    with context.write (health Watch, RagService.Query): the wrapper writes what a generator yields,
    so both shapes work and `around` spans the whole stream.
    """
    codec = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_one_response(handler.unary_unary, around), **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_one_response(handler.stream_unary, around), **codec)
    inner = handler.unary_stream or handler.stream_stream

    async def streaming(request_or_requests: Any, context: grpc.aio.ServicerContext) -> None:
        async with around(context):
            responses = inner(request_or_requests, context)
            if inspect.isasyncgen(responses):
                async for response in responses:
                    await context.write(response)
            else:
                await responses

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
    return grpc.stream_stream_rpc_method_handler(streaming, **codec)


def _one_response(inner: Callable[..., Any], around: AroundCall) -> Callable[..., Any]:
    """A method with one response (unary or client-streaming request), run inside `around`."""

    async def call(request_or_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async with around(context):
            return await inner(request_or_requests, context)

    return call


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


class AroundCallInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The shape every ragserve interceptor shares; subclasses fill in one or more of three steps.

    `refuse` answers from the call's details before the method is looked up (None lets it through);
    `applies` picks the methods to wrap; `around` runs around each call of those.
    """

    def refuse(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return None

    def applies(self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler) -> bool:
        return True

    def around(self, context: grpc.aio.ServicerContext) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        refusal = self.refuse(handler_call_details)
        if refusal is not None:
            return refusal
        handler = await continuation(handler_call_details)
        if handler is None or not self.applies(handler_call_details, handler):
            return handler
        return wrap_handler(handler, self.around)
