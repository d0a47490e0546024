"""The remote generator against scripted HTTP servers (FakeVllmServer): routing, fail-over, the
hedge, errors, aborts, health and connection reuse. Real vLLM servers: tests/e2e/float32/test_remote.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from ragserve.errors import ConfigError, InvalidArgument, Overloaded, Unavailable
from ragserve.events import GenerationChunk
from ragserve.generate.remote import RemoteVllmGenerator
from ragserve.generate.routing import order_servers, routing_key
from ragserve.metrics import REPLICA_HEDGES
from ragserve.prompt import Prompt, build_prompt
from ragserve.types import GenerateParams
from tests.generate.fake_vllm_server import FakeVllmServer
from tests.generate.remote_harness import RemoteTest, bees_prompt, collect, run_with_fakes

PARAMS = GenerateParams(max_tokens=8, temperature=0.0)


def run(test: RemoteTest, servers: int = 2, start: bool = True, **settings: Any) -> None:
    run_with_fakes(test, servers=servers, start=start, **settings)


async def _until(done: Callable[[], bool]) -> None:
    """Polls `done` for 10 s at least (a server notices an abort a few loop turns late, more on a loaded host)."""
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.02)


def _serving(fakes: list[FakeVllmServer]) -> list[int]:
    """How many completions (warm-up excluded) each fake received."""
    return [sum(1 for b in f.bodies if b["max_tokens"] != 1) for f in fakes]


def test_streams_text_and_usage_with_our_own_request_id() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        chunks = await collect(generator.stream(bees_prompt(), PARAMS, "client-trace-id"))
        assert "".join(c.text for c in chunks) == "The answer."
        last = chunks[-1]
        assert last.finished and last.finish_reason == "stop" and last.usage is not None
        assert last.usage.prefix_cache_hit_tokens == 64 and last.usage.completion_tokens == 3
        (body,) = [b for f in fakes for b in f.bodies if b["max_tokens"] == 8]
        # Token ids of the locally rendered prompt, our own id, never the caller's.
        assert body["prompt"] and all(isinstance(t, int) for t in body["prompt"])
        assert body["request_id"] != "client-trace-id" and len(body["request_id"]) == 32
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
        # Every server got the template prefix at start.
        assert all(any(b["max_tokens"] == 1 for b in f.bodies) for f in fakes)

    run(test)


def test_one_document_goes_to_one_server_and_moves_only_when_it_is_down() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        for _ in range(3):
            await collect(generator.stream(bees_prompt("bees.txt#0"), PARAMS, "t"))
        counts = _serving(fakes)
        assert sorted(counts) == [0, 3]  # all three on one server
        # Different documents spread over both servers.
        for i in range(20):
            await collect(generator.stream(bees_prompt(f"doc{i}.txt#0"), PARAMS, "t"))
        assert min(_serving(fakes)) >= 4
        # That server stops: its documents move to the other, without an error.
        home = fakes[counts.index(3)]
        await home.stop()
        before = _serving(fakes)
        chunks = await collect(generator.stream(bees_prompt("bees.txt#0"), PARAMS, "t"))
        assert chunks[-1].finished
        assert sum(_serving(fakes)) == sum(before) + 1
        assert [r.up for r in generator.replica_states()].count(False) == 1

    run(test)


def test_round_robin_alternates() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        for _ in range(4):
            await collect(generator.stream(bees_prompt("bees.txt#0"), PARAMS, "t"))
        assert _serving(fakes) == [2, 2]

    run(test, remote_routing="round_robin")


def test_a_failing_server_is_left_for_the_next_one_before_the_first_token() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        first = generator._order(routing_key(bees_prompt()))[0]
        failing = next(f for f in fakes if f.url == first.url)
        failing.status = 500
        chunks = await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert chunks[-1].finished  # answered by the other one
        assert _serving(fakes) == [1, 1]  # asked both: the failing one first

    run(test)


def test_both_servers_down_is_unavailable_at_once() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        for fake in fakes:
            await fake.stop()
        with pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        with pytest.raises(Unavailable):
            await generator.check_health()
        # Once down, the next call does not even try: no server gets another failed attempt.
        assert [r.up for r in generator.replica_states()] == [False, False]
        failures = [s.failures for s in generator.servers]
        with pytest.raises(Unavailable, match="no generation server is up"):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert [s.failures for s in generator.servers] == failures

    run(test)


def test_health_needs_only_one_server_and_a_probe_brings_a_server_back() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].healthy = False
        await generator.check_health()  # one is enough
        assert [r.up for r in generator.replica_states()] == [False, True]
        fakes[0].healthy = True
        await generator.check_health()
        assert [r.up for r in generator.replica_states()] == [True, True]

    run(test)


@pytest.mark.parametrize(("status", "error"), [(503, Overloaded), (429, Overloaded), (400, InvalidArgument)])
def test_server_answers_map_to_the_callers_error(status: int, error: type[Exception]) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].status = status
        with pytest.raises(error):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))

    run(test, servers=1)


def test_a_server_dying_mid_answer_is_unavailable_never_a_short_answer() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].die_after_words = 2
        got: list[GenerationChunk] = []
        with pytest.raises(Unavailable):
            async for chunk in generator.stream(bees_prompt(), PARAMS, "t"):
                got.append(chunk)
        assert "".join(c.text for c in got) == "The answer" and not any(c.finished for c in got)

    run(test, servers=1)


def test_closing_the_stream_aborts_the_request_on_the_server() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].token_delay_s = 0.5
        stream = generator.stream(bees_prompt(), PARAMS, "t")
        assert (await anext(stream)).text == "The"
        await stream.aclose()  # aclose: what the pipeline does on cancel and deadline
        for _ in range(50):
            if fakes[0].running == 0:
                break
            await asyncio.sleep(0.02)
        assert fakes[0].running == 0 and fakes[0].aborted == 1
        assert generator.unfinished_requests() == 0

    run(test, servers=1)


def test_one_hedge_when_the_first_token_is_late() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        key = routing_key(bees_prompt())
        first = generator._order(key)[0]
        slow = next(f for f in fakes if f.url == first.url)
        fast = next(f for f in fakes if f is not slow)
        slow.first_token_delay_s = 30.0  # without the hedge the answer would wait 30 s for it
        answered = [f.completed for f in (fast, slow)]  # the warm-ups
        hedges = REPLICA_HEDGES._value.get()
        chunks = await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert chunks[-1].finished  # the second server answered, the first never did:
        assert [f.completed for f in (fast, slow)] == [answered[0] + 1, answered[1]]
        # ... sent there by the hedge, not by a fail-over once the slow one hit the stall limit.
        assert REPLICA_HEDGES._value.get() == hedges + 1 and first.failures == 0 and first.up
        await _until(lambda: slow.aborted == 1 and slow.running == 0)
        assert slow.aborted == 1 and slow.running == 0  # the loser was aborted

    run(test, remote_hedge_after_ms=100)


def test_the_pool_is_opened_at_start_and_reused() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        opened = set(fakes[0].connections)
        # The request pool's size (the in-flight limit), opened before serving, and the one
        # background connection the model check and the warm-up took.
        assert len(opened) == 4 + 1
        for _ in range(5):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert fakes[0].connections == opened  # five calls, no new connection

    run(test, servers=1)


def test_a_server_with_another_model_is_refused_at_start() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].model = "/models/some-other-model"
        with pytest.raises(ConfigError, match="some-other-model"):
            await generator.start()

    run(test, servers=1, start=False)


def test_the_routing_key_names_no_document_and_follows_the_top_passage() -> None:
    assert routing_key(bees_prompt("bees.txt#0")) == routing_key(bees_prompt("bees.txt#0"))
    assert routing_key(bees_prompt("bees.txt#0")) != routing_key(bees_prompt("bees.txt#1"))
    assert "bees" not in routing_key(bees_prompt("bees.txt#0"))
    assert routing_key(build_prompt("No passages?", [])) == ""


def test_one_more_server_at_most_then_unavailable() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        order = generator._order(routing_key(bees_prompt()))
        by_url = {f.url: f for f in fakes}
        for replica in order[:2]:
            by_url[replica.url].status = 500
        with pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert _serving([by_url[r.url] for r in order]) == [1, 1, 0]  # the third was never asked

    run(test, servers=3)


def test_the_kv_cache_is_what_the_servers_that_are_up_report() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[1].kv_blocks, fakes[1].block_size = 7, 16
        assert await generator.kv_cache_tokens() == 100 * 32 + 7 * 16
        fakes[1].kv_blocks = None  # a router, or an engine without vLLM's metrics: nothing to pre-fill there
        assert await generator.kv_cache_tokens() == 100 * 32
        fakes[1].kv_blocks = 7
        generator.servers[0].up = False
        assert await generator.kv_cache_tokens() == 7 * 16
        await fakes[1].stop()  # gone since its last probe
        assert await generator.kv_cache_tokens() == 0

    run(test)


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_warming_waits_for_the_servers_still_coming_up_and_warms_where_questions_will_go() -> None:
    def slow_second(fakes: list[FakeVllmServer]) -> None:
        fakes[1].models_delay_s = 1.0

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        await generator.start()
        assert [s.up for s in generator.servers] == [True, False]  # serving; the second is still loading

        # A passage whose questions go to the second server once both are up.
        def first_server(prompt: Prompt) -> object:
            return order_servers(generator.servers, routing_key(prompt), "document", itertools.count())[0]

        prompts = (bees_prompt(f"bees.txt#{i}") for i in range(100))
        prompt = next(p for p in prompts if first_server(p) is generator.servers[1])
        assert await generator.kv_cache_tokens() == 2 * 100 * 32  # both caches: it waited for the second
        await generator.prefill(prompt)
        assert [len(f.bodies) for f in fakes] == [1, 2]  # each: the template at bring-up; the passage on its server

    run_with_fakes(test, servers=2, start=False, prepare=slow_second)
