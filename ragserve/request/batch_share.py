"""Batch's share of the engine: batch Queries hold one of a few slots while they generate; people
never wait for them (RAGSERVE_BATCH_MAX_ENGINE_SEQS)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ragserve.budget import RequestContext
from ragserve.errors import DeadlineExpired


class BatchShare:
    """Batch's share of the engine: a batch request holds one of its slots while it generates and
    waits for one within its deadline (DEADLINE_EXCEEDED past it); interactive requests pass
    straight through, so they never wait for batch work. `seqs` 0: no cap."""

    def __init__(self, seqs: int) -> None:
        self._slots = asyncio.Semaphore(seqs) if seqs > 0 else None

    @contextlib.asynccontextmanager
    async def hold(self, request: RequestContext) -> AsyncIterator[None]:
        slots = self._slots
        if slots is None or request.interactive:
            yield
            return
        with request.stage("engine_wait"):
            try:
                async with asyncio.timeout_at(request.deadline.client_end(asyncio.get_running_loop())):
                    await slots.acquire()
            except TimeoutError as exc:
                raise DeadlineExpired("the deadline passed while batch work waited for the generator") from exc
        try:
            yield
        finally:
            slots.release()
