"""One answer streamed from a Generator: deltas as they come, and what the run cost.

The engine gets the prompt before the caller's first event is sent (prefill overlaps the send),
the caller's deadline is an absolute end (time spent while the consumer holds an event is not
added on top), and leaving early (cancel, error, client gone) aborts the engine request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ragserve.errors import DeadlineExpired
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt
from ragserve.types import GenerateParams, StageTimings, Usage

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

    def record(self, timings: StageTimings) -> None:
        """Into the request's final timings (all counted from the request's start)."""
        timings.generation_ms = self.ended_ms - self.started_ms
        timings.ttft_ms = self.first_token_ms or 0.0
        timings.time_per_output_token_ms = self.time_per_output_token_ms()
        timings.total_ms = self.ended_ms


async def stream_answer(
    generator: Generator,
    prompt: Prompt,
    params: GenerateParams,
    trace_id: str,
    deadline_at: float | None,
    elapsed_ms: Callable[[], float],
    run: AnswerRun,
    before_first: T,
) -> AsyncGenerator[T | str, None]:
    """`before_first` (the retrieval event), then the answer's text deltas, recorded in `run`.

    `deadline_at`: the caller's deadline on the event loop's clock (None: none); past it,
    DeadlineExpired.
    """
    run.started_ms = elapsed_ms()
    stream = generator.stream(prompt, params, trace_id)
    # Hand the prompt to the engine before the first event is sent: prefill overlaps the send.
    first = asyncio.ensure_future(anext(stream))
    try:
        yield before_first
        async with asyncio.timeout_at(deadline_at):
            async for step in _resume(first, stream):
                if step.text:
                    if run.first_token_ms is None:
                        run.first_token_ms = elapsed_ms()
                    run.pieces.append(step.text)
                    yield step.text
                if step.finished:
                    run.usage = step.usage or run.usage
                    run.finish_reason = step.finish_reason
    except TimeoutError as exc:
        raise DeadlineExpired("client deadline passed during generation") from exc
    finally:
        # The caller went away (or failed) before the first step: abort the engine request.
        if not first.done():
            first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        if isinstance(stream, AsyncGenerator):
            await stream.aclose()
        run.ended_ms = elapsed_ms()
