"""The generator contract (tests/generate/contract.py) on the remote generator over fake vLLM servers.
The same checks run on the in-process engine and on a real vLLM server end to end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from ragserve.generate.base import Generator
from ragserve.generate.remote import RemoteVllmGenerator
from tests.generate import contract
from tests.generate.fake_vllm_server import FakeVllmServer
from tests.generate.remote_harness import RemoteTest, run_with_fakes


def _prepare(fakes: list[FakeVllmServer]) -> None:
    for fake in fakes:
        fake.words = [" word"] * 400  # long enough to be cut short
        fake.token_delay_s = 0.01


def _run(check: RemoteTest) -> None:
    run_with_fakes(check, prepare=_prepare)


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
