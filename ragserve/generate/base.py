"""The generator contract: stream text for a prompt, abort on cancellation, report health."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from ragserve.events import GenerationChunk
from ragserve.prompt import Prompt
from ragserve.reports import EngineChoice, GeneratorStatus
from ragserve.types import GenerateParams


@runtime_checkable
class Generator(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def answer_identity(self) -> str:
        """What decides an answer's text besides the prompt: the model that answers, a digest of its
        files and the engine settings that change a greedy answer (the answer cache's key holds it)."""
        ...

    @property
    def engine_choices(self) -> tuple[EngineChoice, ...]:
        """The engine settings in force and why each was chosen (host or explicit setting)."""
        ...

    @property
    def host_cpu(self) -> str:
        """The CPU the settings were chosen for, with the flags that decided them."""
        ...

    async def start(self) -> None:
        """Load the model and warm it (including the prompt's fixed prefix)."""
        ...

    def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        """Text deltas as the engine produces them. Cancelling the iteration aborts the request.

        `trace_id`: the caller's request id, for logs only. The engine request gets an id the
        generator makes itself, unique per call, so no caller can name (or collide with) another's."""
        ...

    async def prefill(self, prompt: Prompt) -> None:
        """Put `prompt` into the prefix cache (warming): after every Query's work where the engine
        schedules by priority (WARMING_ENGINE_PRIORITY), no text kept, bounded in time."""
        ...

    async def check_health(self) -> None:
        """Raise Unavailable when the engine is dead."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens `text` takes in a prompt with this model's tokenizer (no special tokens)."""
        ...

    def prompt_tokens(self, prompt: Prompt) -> int:
        """Tokens of `prompt` as the engine reads it: chat template, markup and pad included."""
        ...

    def unfinished_requests(self) -> int: ...

    async def kv_cache_tokens(self) -> int:
        """Tokens the engine's KV cache holds in all (0 when not known)."""
        ...

    def status(self) -> GeneratorStatus:
        """Where it runs: on this host's CPUs (with its share of them) or on servers (each one's state)."""
        ...

    async def close(self) -> None: ...
