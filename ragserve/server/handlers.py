"""Running code around every call of a gRPC method handler (a check, a bound), whatever its shape."""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with around(context):
                return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with around(context):
                return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **codec)
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
