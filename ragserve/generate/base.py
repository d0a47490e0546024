"""The generator contract: stream text for a prompt, abort on cancellation, report health."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from ragserve.prompt import Prompt
from ragserve.types import GenerateParams, GenerationChunk


@runtime_checkable
class Generator(Protocol):
    @property
    def model_id(self) -> str: ...

    async def start(self) -> None:
        """Load the model and warm it (including the prompt's fixed prefix)."""
        ...

    def stream(self, prompt: Prompt, params: GenerateParams, request_id: str) -> AsyncIterator[GenerationChunk]:
        """Text deltas as the engine produces them. Cancelling the iteration aborts the request."""
        ...

    async def check_health(self) -> None:
        """Raise Unavailable when the engine is dead."""
        ...

    def unfinished_requests(self) -> int: ...

    async def close(self) -> None: ...
