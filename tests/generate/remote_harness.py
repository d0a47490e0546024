"""Driving the remote generator against fake vLLM servers (tests/generate/fake_vllm_server.py): a
prompt, collecting a stream, and one run of a test with N fakes started and stopped around it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ragserve.config import GeneratorSettings
from ragserve.events import GenerationChunk
from ragserve.generate.remote import RemoteVllmGenerator
from ragserve.prompt import Prompt, build_prompt
from ragserve.types import Chunk, Passage
from tests.generate.fake_vllm_server import FakeVllmServer

# The folder the sidecar serves (the base with the shipped adapter merged): what servers run.
MODEL = GeneratorSettings().resolved_model()
RemoteTest = Callable[[RemoteVllmGenerator, list[FakeVllmServer]], Awaitable[None]]


def bees_prompt(chunk_id: str = "bees.txt#0") -> Prompt:
    return build_prompt("How do bees dance?", [Passage(Chunk(chunk_id, "bees.txt", "Bees dance."), 1.0, 1)])


async def collect(stream: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in stream]


def run_with_fakes(
    test: RemoteTest,
    servers: int = 2,
    pool_size: int = 4,
    start: bool = True,
    prepare: Callable[[list[FakeVllmServer]], None] | None = None,
    limit_s: float = 60.0,
    **settings: Any,
) -> None:
    """`test` against a generator over `servers` fakes (`prepare` scripts them before it starts);
    a regression fails within `limit_s` instead of hanging the suite."""

    async def main() -> None:
        fakes = [await FakeVllmServer(model=MODEL).start() for _ in range(servers)]
        if prepare is not None:
            prepare(fakes)
        generator = RemoteVllmGenerator(
            GeneratorSettings(backend="remote", remote_urls=",".join(f.url for f in fakes), **settings), pool_size, 2.0
        )
        try:
            if start:
                await generator.start()  # serves once one server is up; the rest join in the background
                await asyncio.gather(*generator._bringing_up, return_exceptions=True)
            async with asyncio.timeout(limit_s):
                await test(generator, fakes)
        finally:
            await generator.close()
            for fake in fakes:
                await fake.stop()

    asyncio.run(main())
