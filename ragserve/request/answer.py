"""One answer streamed from a Generator: started first, iterated after, with what the run cost.

`AnswerStream.start` hands the prompt to the engine at once, so prefill overlaps whatever the
caller sends before iterating (the retrieval event); `deltas` then streams the text with the
caller's deadline as an absolute end (time spent while the consumer holds an event is not added on
top). Closing the stream early (cancel, error, client gone) aborts the engine request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ragserve.errors import DeadlineExpired
from ragserve.events import GenerationChunk, TokenDelta, Usage
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt
from ragserve.types import GenerateParams

T = TypeVar("T")


async def _resume(first: asyncio.Future[T], rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """The first item from an already started `anext`, then the rest of the same iterator."""
    try:
        item = await first
    except StopAsyncIteration:
        return
    yield item
    async for item in rest:
        yield item


@dataclass(slots=True)
class AnswerRun:
    """What one generation produced, filled in as it streams. Times are in ms on the request's
    clock (`elapsed_ms`: since the request started)."""

    pieces: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    finish_reason: str = ""
    started_ms: float = 0.0
    first_token_ms: float | None = None
    ended_ms: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def time_per_output_token_ms(self) -> float:
        if self.first_token_ms is None or self.usage.completion_tokens <= 1:
            return 0.0
        return (self.ended_ms - self.first_token_ms) / (self.usage.completion_tokens - 1)


class AnswerStream:
    """A generation in flight; iterate `deltas` once, and close it (`aclose`) in any case."""

    def __init__(self, stream: AsyncIterator[GenerationChunk], elapsed_ms: Callable[[], float], started_ms: float):
        self.run = AnswerRun(started_ms=started_ms)
        self._stream = stream
        self._elapsed_ms = elapsed_ms
        self._first = asyncio.ensure_future(anext(stream))

    @classmethod
    def start(
        cls,
        generator: Generator,
        prompt: Prompt,
        params: GenerateParams,
        trace_id: str,
        elapsed_ms: Callable[[], float],
    ) -> AnswerStream:
        """The engine gets the prompt now (on the running loop's next turn)."""
        started = elapsed_ms()
        return cls(generator.stream(prompt, params, trace_id), elapsed_ms, started)

    def elapsed_ms(self) -> float:
        """Now, on the request's clock."""
        return self._elapsed_ms()

    @property
    def first_step(self) -> asyncio.Future[GenerationChunk]:
        """Done when the engine's first step arrives (or the request fails): its prefill is over."""
        return self._first

    async def deltas(self, deadline_at: float | None) -> AsyncIterator[TokenDelta]:
        """The answer's text as it comes. `deadline_at`: the caller's deadline on the event loop's
        clock (None: none); past it, DeadlineExpired."""
        run = self.run
        try:
            async with asyncio.timeout_at(deadline_at):
                async for step in _resume(self._first, self._stream):
                    if step.text:
                        if run.first_token_ms is None:
                            run.first_token_ms = self._elapsed_ms()
                        run.pieces.append(step.text)
                        yield TokenDelta(step.text)
                    if step.finished:
                        run.usage = step.usage or run.usage
                        run.finish_reason = step.finish_reason
        except TimeoutError as exc:
            raise DeadlineExpired("client deadline passed during generation") from exc

    async def aclose(self) -> None:
        """Abort the engine request unless it finished (the caller left before the first step, or mid-answer)."""
        if not self._first.done():
            self._first.cancel()
        await asyncio.gather(self._first, return_exceptions=True)
        if isinstance(self._stream, AsyncGenerator):
            await self._stream.aclose()
        self.run.ended_ms = self._elapsed_ms()
