"""Fakes shared by the unit tests (named as fakes: the end-to-end tests run the real engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
