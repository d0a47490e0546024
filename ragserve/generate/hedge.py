"""The first event of a remote answer: one server asked, and one more at most, when the first fails
before its first event (fail-over) or sends nothing within the hedge bound (hedge). The first event
wins; the other request is aborted (docs/remote.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ragserve.errors import InvalidArgument, Unavailable
from ragserve.generate.vllm_server import VllmServer
from ragserve.generate.vllm_wire import ServerFailed, ServerRejected
from ragserve.metrics import REPLICA_HEDGES

Events = AsyncGenerator[tuple[str, Any], None]
# Each attempt still waiting for its first event: its server, its stream, when it started.
_Running = dict[asyncio.Task[tuple[str, Any]], tuple[VllmServer, Events, float]]


async def first_event(
    order: list[VllmServer],
    stream_on: Callable[[VllmServer], Events],
    hedge_after_s: float | None,
    failed: Callable[[VllmServer, BaseException], None],
) -> tuple[VllmServer, Events, tuple[str, Any]]:
    """The server that answered first, its stream, and that first event. `order`: the servers to
    try, best first (the first two are used at most); `stream_on`: a server's stream of this request;
    `failed`: told of each server that failed before its first event."""
    spare = order[1:2]
    running: _Running = {}
    rejected = 0

    def launch(server: VllmServer) -> None:
        events = stream_on(server)
        running[asyncio.ensure_future(anext(events))] = (server, events, time.perf_counter())

    launch(order[0])
    try:
        while running:
            done, _ = await asyncio.wait(
                running, timeout=hedge_after_s if spare else None, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:  # the hedge bound passed without a token
                hedge_after_s = None
                # Only onto a server less busy than the slow one: when all are slow because all
                # are loaded, a hedge would only add load.
                if spare[0].in_flight < order[0].in_flight and spare[0].has_room:
                    REPLICA_HEDGES.inc()
                    launch(spare.pop(0))
                continue
            for task in done:
                server, events, started = running.pop(task)
                try:
                    first = task.result()
                except (ServerFailed, StopAsyncIteration) as exc:
                    rejected += isinstance(exc, ServerRejected)
                    failed(
                        server, exc if isinstance(exc, ServerFailed) else ServerFailed("stream ended before any event")
                    )
                    await events.aclose()
                    if spare and spare[0].has_room:
                        launch(spare.pop(0))
                        hedge_after_s = None
                    continue
                server.ttft_ms.append((time.perf_counter() - started) * 1000.0)
                await _abort(running)
                return server, events, first
        if rejected:
            # Every server asked refused the request itself: tell the caller, not "unavailable".
            raise InvalidArgument(
                "query", "the generator rejected the prompt (longer than its context with the passages?)"
            )
        raise Unavailable("the generation servers failed before the answer started")
    except BaseException:
        await _abort(running)
        raise


async def _abort(running: _Running) -> None:
    for task, (_, events, _) in list(running.items()):
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await events.aclose()
    running.clear()
