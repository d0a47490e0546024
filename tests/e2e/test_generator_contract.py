"""The generator contract (tests/generate/contract.py) on vLLM's engine in this process, as the
sidecar runs it by default: the embedded model with the shipped adapter merged in at set-up. The
remote generator meets it over a real vLLM server in tests/e2e/float32/test_remote.py and over fakes in
tests/generate/test_contract.py."""

from __future__ import annotations

import asyncio

import pytest

from ragserve.config import DEFAULT_GENERATOR_NAME, GeneratorSettings
from ragserve.config.base import DEFAULT_ADAPTER_NAME
from ragserve.generate.vllm_engine import VllmGenerator
from tests.generate import contract


def test_the_local_engine_meets_the_generator_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the server does (ragserve/logs.py): vLLM, imported here for the first time in this process,
    # must not install logging of its own that later tests' log set-up would then run beside.
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")

    async def run() -> None:
        generator = VllmGenerator(GeneratorSettings())
        assert generator.model_id == f"{DEFAULT_GENERATOR_NAME}+{DEFAULT_ADAPTER_NAME}"  # the merged folder
        await generator.start()
        try:

            async def held() -> int:
                return generator.unfinished_requests()

            await contract.run_all(generator, held)
        finally:
            await contract.unhealthy_once_stopped(generator, generator.close)

    asyncio.run(run())
