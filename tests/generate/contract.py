"""The generator contract: what every Generator (generate/base.py) does, whatever runs behind it.

Each check takes a started generator and a `held()` that says how many requests the engine or the
servers behind it still hold (the engine's own count, a fake's, a real vLLM server's metrics), so
an abort is checked where it happens. Run on the remote generator over fakes (the quick suite,
tests/generate/test_contract.py), on the in-process engine and on a real vLLM server (end to end:
tests/e2e/test_generator_contract.py, tests/e2e/float32/test_remote.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from ragserve.errors import Unavailable
from ragserve.events import GenerationChunk
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt, build_prompt
from ragserve.types import Chunk, GenerateParams, Passage

Held = Callable[[], Awaitable[int]]


def contract_prompt() -> Prompt:
    passage = Passage(Chunk("bees.txt#0", "bees.txt", "Honey bees dance to tell where food is."), 1.0, 1)
    return build_prompt("Why do honey bees dance? Answer in detail.", [passage])


async def _idle(held: Held, within_s: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while (count := await held()) > 0:
        if loop.time() > end:
            raise AssertionError(f"{count} request(s) still held {within_s:g} s after the stream ended")
        await asyncio.sleep(0.02)


async def streams_text_then_one_final_chunk(generator: Generator, held: Held) -> None:
    chunks = [c async for c in generator.stream(contract_prompt(), GenerateParams(16, 0.0), "contract")]
    assert "".join(c.text for c in chunks).strip(), "no text"
    assert [c.finished for c in chunks].count(True) == 1 and chunks[-1].finished
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length") and final.usage is not None
    assert 0 < final.usage.completion_tokens <= 16 and final.usage.prompt_tokens > 0
    # What warming charges a passage against its share of the KV cache is counted this way.
    assert final.usage.prompt_tokens == generator.prompt_tokens(contract_prompt())
    await _idle(held, 2.0)


async def stops_at_max_tokens(generator: Generator, held: Held) -> None:
    chunks = [c async for c in generator.stream(contract_prompt(), GenerateParams(3, 0.0), "contract")]
    final = chunks[-1]
    assert final.usage is not None and final.usage.completion_tokens <= 3
    assert final.finish_reason in ("length", "stop")


async def aborts_when_the_stream_is_closed(generator: Generator, held: Held) -> None:
    stream = generator.stream(contract_prompt(), GenerateParams(400, 0.0), "contract")
    got: list[GenerationChunk] = []
    async for chunk in stream:
        got.append(chunk)
        if len(got) == 2:
            break
    assert len(got) == 2 and not any(c.finished for c in got)
    await stream.aclose()  # type: ignore[attr-defined]
    await _idle(held, 2.0)
    assert generator.unfinished_requests() == 0


async def aborts_at_the_callers_deadline(generator: Generator, held: Held) -> None:
    stream = generator.stream(contract_prompt(), GenerateParams(400, 0.0), "contract")
    first = await anext(stream)  # the request is running in the engine (or on the server) now
    assert not first.finished
    last = first
    try:
        async with asyncio.timeout(0.001):  # the caller's deadline passes while it decodes
            async for chunk in stream:
                last = chunk
    except TimeoutError:
        pass
    else:
        # On a loaded host a server may have sent the whole (short) answer before the deadline:
        # then it arrived complete, and nothing was left to abort.
        assert last.finished
    # What the pipeline does on a deadline: close the stream (here, not when garbage collected).
    await stream.aclose()  # type: ignore[attr-defined]
    await _idle(held, 2.0)


async def reports_health_and_kv_size(generator: Generator, held: Held) -> None:
    await generator.check_health()
    assert await generator.kv_cache_tokens() > 0
    assert generator.count_tokens("Honey bees dance.") > 0
    assert generator.answer_identity and generator.model_id


async def prefills_without_holding_a_request(generator: Generator, held: Held) -> None:
    await generator.prefill(contract_prompt())
    await _idle(held, 2.0)


CHECKS = [
    streams_text_then_one_final_chunk,
    stops_at_max_tokens,
    aborts_when_the_stream_is_closed,
    aborts_at_the_callers_deadline,
    reports_health_and_kv_size,
    prefills_without_holding_a_request,
]


async def run_all(generator: Generator, held: Held) -> None:
    """Every check in turn on one started generator (for backends that take long to start)."""
    for check in CHECKS:
        try:
            await check(generator, held)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc


async def unhealthy_once_stopped(generator: Generator, stop: Callable[[], Awaitable[None]]) -> None:
    """After what serves it has stopped, health says so (UNAVAILABLE), and so does a call."""
    await stop()
    with pytest.raises(Unavailable):
        await generator.check_health()
    with pytest.raises(Unavailable):
        async for _ in generator.stream(contract_prompt(), GenerateParams(4, 0.0), "contract"):
            pass
