"""Fakes shared by the unit tests (named as fakes: the end-to-end tests run the real engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ragserve.index.base import SearchIndex
from ragserve.prompt import Prompt
from ragserve.types import EngineChoice, GenerateParams, GenerationChunk


class FakeGeneratorBase:
    """The Generator contract with nothing behind it; subclasses script `stream`.

    Tokens are counted as whitespace-separated words."""

    model_id = "fake-generator"
    engine_choices: tuple[EngineChoice, ...] = ()
    host_cpu = "fake CPU"

    async def start(self) -> None:
        return None

    def stream(self, prompt: Prompt, params: GenerateParams, request_id: str) -> AsyncIterator[GenerationChunk]:
        raise NotImplementedError

    async def check_health(self) -> None:
        return None

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def unfinished_requests(self) -> int:
        return 0

    async def close(self) -> None:
        return None


class FakeEndlessGenerator(FakeGeneratorBase):
    """Streams `piece` forever (an engine that never finishes); counts streams opened and closed.

    A stream closed early is the server aborting the engine request."""

    def __init__(self, piece: str = "word ", delay_s: float = 0.0) -> None:
        self.piece = piece
        self.delay_s = delay_s
        self.opened = 0
        self.closed = 0

    async def stream(self, prompt: Prompt, params: GenerateParams, request_id: str) -> AsyncIterator[GenerationChunk]:
        self.opened += 1
        try:
            while True:
                await asyncio.sleep(self.delay_s)
                yield GenerationChunk(self.piece, False, "", None)
        finally:
            self.closed += 1


class FakeServing:
    """Serves one index and takes a new one, as the pipeline does for the hot reloader (ServedIndex)."""

    def __init__(self, index: SearchIndex) -> None:
        self.index = index

    def swap_index(self, index: SearchIndex) -> None:
        self.index = index
