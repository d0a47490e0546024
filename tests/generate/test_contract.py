"""The generator contract (tests/generate/contract.py) on the remote generator over fake vLLM servers.
The same checks run on the in-process engine and on a real vLLM server end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from ragserve.config import GeneratorSettings, default_generator_path
from ragserve.generate.base import Generator
from ragserve.generate.remote import RemoteVllmGenerator
from tests.generate import contract
from tests.generate.fake_vllm_server import FakeVllmServer


def _run(check: Callable[[RemoteVllmGenerator, list[FakeVllmServer]], Awaitable[None]]) -> None:
    async def main() -> None:
        fakes = []
        for _ in range(2):
            fake = await FakeVllmServer(model=str(default_generator_path())).start()
            fake.words = [" word"] * 400  # long enough to be cut short
            fake.token_delay_s = 0.01
            fakes.append(fake)
        settings = GeneratorSettings(backend="remote", remote_urls=",".join(f.url for f in fakes))
        generator = RemoteVllmGenerator(settings, 4, 2.0)
        try:
            await generator.start()
            await asyncio.gather(*generator._bringing_up, return_exceptions=True)
            await check(generator, fakes)
        finally:
            await generator.close()
            for fake in fakes:
                await fake.stop()

    asyncio.run(main())


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda check: check.__name__)
def test_the_remote_generator_over_fakes_meets_the_contract(
    check: Callable[[Generator, contract.Held], Awaitable[None]],
) -> None:
    async def run(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        async def held() -> int:
            return sum(f.running for f in fakes)

        await check(generator, held)

    _run(run)


def test_the_remote_generator_is_unhealthy_once_its_servers_stop() -> None:
    async def run(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        async def stop() -> None:
            for fake in fakes:
                await fake.stop()

        await contract.unhealthy_once_stopped(generator, stop)

    _run(run)
