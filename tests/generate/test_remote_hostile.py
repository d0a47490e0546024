"""The remote generator against broken and hostile peers (FakeVllmServer scripted to misbehave): what a
server sends is bounded, whatever it sends costs that server and never the sidecar, and a busy server
is never taken for a dead one. Each test here failed on the generator before these limits."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ragserve.config import GeneratorSettings
from ragserve.errors import InvalidArgument, Overloaded, Unavailable
from ragserve.events import GenerationChunk
from ragserve.generate.remote import RemoteVllmGenerator
from ragserve.generate.routing import routing_key
from ragserve.generate.vllm_wire import CHARS_PER_TOKEN_MAX, INT32_MAX, ServerFailed, parse_chunk
from ragserve.types import GenerateParams
from tests.generate.fake_vllm_server import FakeVllmServer
from tests.generate.remote_harness import MODEL, RemoteTest, bees_prompt, collect, run_with_fakes

PARAMS = GenerateParams(max_tokens=8, temperature=0.0)


def run(
    test: RemoteTest,
    servers: int = 2,
    pool_size: int = 4,
    start: bool = True,
    prepare: Callable[[list[FakeVllmServer]], None] | None = None,
    **settings: Any,
) -> None:
    run_with_fakes(test, servers=servers, pool_size=pool_size, start=start, prepare=prepare, **settings)


def _first_and_other(
    generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]
) -> tuple[FakeVllmServer, FakeVllmServer]:
    """The fake the prompt is routed to first, and the other one."""
    first_url = generator._order(routing_key(bees_prompt()))[0].url
    first = next(f for f in fakes if f.url == first_url)
    return first, next(f for f in fakes if f is not first)


def _server(generator: RemoteVllmGenerator, fake: FakeVllmServer) -> Any:
    return next(s for s in generator.servers if s.url == fake.url)


@contextmanager
def peak_rss_growth_mib() -> Iterator[list[float]]:
    """The process's peak RSS growth over the block, in MiB (the peak is reset first)."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS

    def hwm() -> float:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) / 1024

    before, growth = hwm(), [0.0]
    yield growth
    growth[0] = hwm() - before


def _gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of zeros, gzip-compressed (about 1 KiB per MiB), built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(mib)) + packer.flush()


# -- 1. GET bodies --------------------------------------------------------------------------------


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_a_gzip_bomb_health_body_is_never_unpacked_nor_read() -> None:
    bomb = _gzip_bomb(512)
    assert len(bomb) < 1 << 20

    def prepare(fakes: list[FakeVllmServer]) -> None:
        fakes[0].health_body, fakes[0].health_encoding = bomb, "gzip"

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        with peak_rss_growth_mib() as growth:
            for _ in range(5):
                await generator.check_health()
        assert all(s.up for s in generator.replica_states())  # the status says healthy: that is all we read
        assert growth[0] < 100, f"{growth[0]:.0f} MiB more at peak"

    run(test, servers=1, prepare=prepare)


def test_a_huge_plain_health_body_is_not_read() -> None:
    def prepare(fakes: list[FakeVllmServer]) -> None:
        fakes[0].health_body = b"x" * (64 << 20)

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].body_bytes_sent = 0
        await generator.check_health()
        await asyncio.sleep(0.2)
        # The socket buffers take a little before the fake sees the connection closed; never all of it.
        assert fakes[0].body_bytes_sent < 16 << 20

    run(test, servers=1, prepare=prepare)


@pytest.mark.parametrize("extra", [b"#" * (9 << 20) + b"\n", b"# " + b"y" * (200 << 10) + b"\n"])
def test_an_oversized_metrics_body_is_refused_and_counts_no_cache(extra: bytes) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].metrics_extra = extra
        with peak_rss_growth_mib() as growth:
            tokens = await generator.kv_cache_tokens()
        assert tokens == (0 if len(extra) > 8 << 20 else 100 * 32)
        assert growth[0] < 100

    run(test, servers=1)


def test_a_gzip_metrics_answer_is_refused_not_unpacked() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        server = generator.servers[0]
        assert server._background is not None
        async with server._get("/metrics") as response:
            assert response.headers.get("Content-Encoding") is None  # we asked for identity
        fakes[0].health_body, fakes[0].health_encoding = _gzip_bomb(16), "gzip"
        from ragserve.generate.vllm_wire import read_capped

        with pytest.raises(ServerFailed, match="gzip"):
            async with server._get("/health") as response:
                await read_capped(response, "/health", 1 << 20)

    run(test, servers=1)


# -- 2. A stream's length ---------------------------------------------------------------------------


def test_a_server_that_ignores_max_tokens_is_cut_off_and_counted_failed() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].ignore_max_tokens = True
        got: list[GenerationChunk] = []
        with pytest.raises(Unavailable):
            async for chunk in generator.stream(bees_prompt(), PARAMS, "t"):
                got.append(chunk)
        assert len(got) <= PARAMS.max_tokens + 8
        assert sum(len(c.text) for c in got) <= PARAMS.max_tokens * CHARS_PER_TOKEN_MAX
        assert generator.servers[0].failures == 1
        await asyncio.sleep(0.1)
        assert fakes[0].running == 0  # the stream was closed: the server's request ended

    run(test, servers=1)


def test_text_past_the_character_cap_is_cut_off() -> None:
    long_word = "z" * (CHARS_PER_TOKEN_MAX * 3)

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].words = [long_word] * 3
        with pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), GenerateParams(max_tokens=2, temperature=0.0), "t"))

    run(test, servers=1)


def test_a_stream_is_bounded_by_the_models_longest_token_not_a_generic_cap() -> None:
    """16 tokens of SmolLM2 decode to at most 16 x its longest token (81 characters), far below
    16 x CHARS_PER_TOKEN_MAX: a server sending 1,400 characters for them is cut off."""

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        longest = generator._renderer.longest_token_chars
        assert 0 < longest < CHARS_PER_TOKEN_MAX
        fakes[0].words = ["y" * 100] * 14
        assert 16 * longest < 14 * 100
        with pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), GenerateParams(max_tokens=16, temperature=0.0), "t"))

    run(test, servers=1)


# -- 3. Probes and busy connections -----------------------------------------------------------------


def test_probes_have_their_own_connections_and_a_busy_server_is_busy_not_down() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].token_delay_s = 1.0
        streams = [generator.stream(bees_prompt(), PARAMS, "t") for _ in range(2)]
        for stream in streams:  # both connections of the pool now stream
            assert (await anext(stream)).text == "The"
        await generator.check_health()  # not blocked behind them, and up
        assert generator.servers[0].up
        with pytest.raises(Overloaded):  # a third call: busy, come back later
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert generator.servers[0].up and generator.servers[0].failures == 0
        for stream in streams:
            await stream.aclose()

    run(test, servers=1, pool_size=2)


def test_sixty_four_calls_streaming_from_one_url_keep_it_healthy() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        # Every stream held open after its first word until the probes are done: on a loaded host
        # a fixed sleep did not see all 64 started.
        fakes[0].gate = gate = asyncio.Event()
        calls = [asyncio.create_task(collect(generator.stream(bees_prompt(), PARAMS, "t"))) for _ in range(64)]
        for _ in range(400):  # up to 20 s, within the 30 s stall limit
            if fakes[0].running == 64 and generator.unfinished_requests() == 64:
                break
            await asyncio.sleep(0.05)
        for _ in range(3):
            await generator.check_health()
        assert generator.servers[0].up
        assert generator.unfinished_requests() == 64
        gate.set()
        results = await asyncio.gather(*calls)
        assert all(r[-1].finished for r in results)

    run(test, servers=1, pool_size=64)


# -- 4. /v1/models of the wrong shape ---------------------------------------------------------------


@pytest.mark.parametrize(
    "answer", [{"data": 1}, [1, 2], {"data": [{"id": ["a"]}]}, {"data": ["x"]}, "text", {"data": [{"id": None}]}]
)
def test_a_malformed_models_answer_is_a_failed_probe_not_a_crash(answer: Any) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        bad = fakes[0]
        bad.healthy = False
        await generator.check_health()  # the bad one goes down (its model is asked again on return)
        bad.healthy, bad.models_json = True, answer
        for _ in range(2):
            await generator.check_health()  # never raises: the good server is up
        assert [s.up for s in generator.servers] == [False, True]
        bad.models_json = None
        await generator.check_health()
        assert [s.up for s in generator.servers] == [True, True]  # probing went on, and it is back

    run(test)


# -- 5. Malformed stream data -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines",
    [
        [b"data: [1]\n\n"],
        [b"data: {not json\n\n"],
        [b'data: {"choices": 3}\n\n'],
        [b'data: {"choices": [{"text": 7}]}\n\n'],
        [b'data: {"choices": [{"text": "a", "finish_reason": "weird"}]}\n\n'],
        [b'data: {"choices": [], "usage": [1]}\n\n'],
        [b'data: {"choices": [], "usage": {"prompt_tokens": "many"}}\n\n'],
        [b"data: " + b"q" * (512 << 10) + b"\n\n"],
    ],
    ids=["list", "not-json", "choices", "text", "finish", "usage", "counts", "long-line"],
)
def test_malformed_stream_data_fails_over_and_counts_against_the_server(lines: list[bytes]) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        bad, _ = _first_and_other(generator, fakes)
        bad.raw_lines = lines
        chunks = await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert "".join(c.text for c in chunks) == "The answer."  # answered by the other server
        assert _server(generator, bad).failures == 1

    run(test)


def test_usage_counts_are_clamped_to_int32() -> None:
    (event,) = parse_chunk({"choices": [], "usage": {"prompt_tokens": 1 << 40, "completion_tokens": -5}})
    assert event[1].prompt_tokens == INT32_MAX and event[1].completion_tokens == 0
    with pytest.raises(ServerFailed):
        parse_chunk({"choices": [], "usage": {"prompt_tokens": True}})


# -- 6. Time limits ---------------------------------------------------------------------------------


def test_a_silent_stream_fails_within_the_stall_limit() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].stall_after_words = 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert loop.time() - started < 5  # the stall limit (0.5 s), not the caller's deadline
        assert generator.servers[0].failures == 1

    run(test, servers=1, remote_stall_s=0.5)


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_start_serves_once_one_server_is_up_and_bounds_a_hung_one() -> None:
    def prepare(fakes: list[FakeVllmServer]) -> None:
        fakes[0].first_token_delay_s = 3600  # answers health and models, never a completion

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await generator.start()
        assert loop.time() - started < 5
        assert [s.up for s in generator.servers] == [False, True]
        await asyncio.sleep(1.5)  # past the start limit: the hung one's bring-up has ended
        assert not generator._bringing_up or all(t.done() for t in generator._bringing_up)
        assert fakes[0].running == 0

    run(test, start=False, prepare=prepare, remote_start_timeout_s=1.0, remote_stall_s=60)


def test_a_hung_warm_stream_is_bounded() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].first_token_delay_s = 3600
        with pytest.raises(TimeoutError):
            await generator.prefill(bees_prompt())
        await asyncio.sleep(0.1)
        assert fakes[0].running == 0

    run(test, servers=1, remote_stall_s=0.5)


# -- 7. The answer cache's key -----------------------------------------------------------------------


def test_the_answer_identity_names_the_served_model_not_the_server_count() -> None:
    def identity(**settings: Any) -> str:
        s = GeneratorSettings(backend="remote", **settings)
        return RemoteVllmGenerator(s, 4, 2.0).answer_identity

    one = identity(remote_urls="http://127.0.0.1:1")
    assert one == identity(remote_urls="http://127.0.0.1:1,http://127.0.0.1:2")
    assert identity(remote_urls="http://127.0.0.1:1", remote_model="tuned-a") != identity(
        remote_urls="http://127.0.0.1:1", remote_model="tuned-b"
    )


def test_a_server_that_comes_back_with_another_model_stays_down(caplog: pytest.LogCaptureFixture) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].healthy = False
        await generator.check_health()
        fakes[0].healthy, fakes[0].model = True, "/models/another-model"
        with caplog.at_level(logging.WARNING):
            await generator.check_health()
        assert [s.up for s in generator.servers] == [False, True]
        assert "another-model" in caplog.text

    run(test)


# -- 10.-12. Names, redirects, request ids, URLs ------------------------------------------------------


def test_each_server_keeps_its_own_served_model_name() -> None:
    def prepare(fakes: list[FakeVllmServer]) -> None:
        fakes[0].models_json = {"data": [{"id": "smol", "root": MODEL}]}  # an alias on one, the path on the other

    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        assert [s.served_model for s in generator.servers] == ["smol", MODEL]
        for i in range(8):
            await collect(generator.stream(bees_prompt(f"doc{i}.txt#0"), PARAMS, "t"))
        assert {b["model"] for b in fakes[0].bodies} == {"smol"}
        assert {b["model"] for b in fakes[1].bodies} == {MODEL}

    run(test, prepare=prepare)


def test_a_redirect_is_not_followed() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        first, _ = _first_and_other(generator, fakes)
        elsewhere = await FakeVllmServer(model=MODEL).start()
        try:
            first.redirect_to = elsewhere.url
            chunks = await collect(generator.stream(bees_prompt(), PARAMS, "t"))
            assert chunks[-1].finished and not elsewhere.bodies  # the prompt never went there
            assert _server(generator, first).failures == 1
        finally:
            await elsewhere.stop()

    run(test)


def test_an_api_key_over_plain_http_off_loopback_is_refused() -> None:
    with pytest.raises(ValueError, match="clear text"):
        GeneratorSettings(backend="remote", remote_urls="http://gpu-1.internal:8000", remote_api_key="k")
    GeneratorSettings(backend="remote", remote_urls="https://gpu-1.internal:8000", remote_api_key="k")
    GeneratorSettings(backend="remote", remote_urls="http://127.0.0.1:8000", remote_api_key="k")
    GeneratorSettings(
        backend="remote",
        remote_urls="http://gpu-1.internal:8000",
        remote_api_key="k",
        remote_allow_plain_http_key=True,
    )


def test_urls_are_normalised_and_deduplicated() -> None:
    s = GeneratorSettings(backend="remote", remote_urls="http://A:8000, http://a:8000/,https://b:443/v1/,http://c:80")
    assert s.remote_url_list() == ["http://a:8000", "https://b/v1", "http://c"]


def test_a_hedge_gets_its_own_request_id() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        first, _ = _first_and_other(generator, fakes)
        first.first_token_delay_s = 2.0
        await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        ids = [b["request_id"] for f in fakes for b in f.bodies if b["max_tokens"] == 8]
        assert len(ids) == 2 and len(set(ids)) == 2

    run(test, remote_hedge_after_ms=100)


# -- 14. Error bodies, 400s, labels ------------------------------------------------------------------


def test_an_error_body_cannot_forge_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        fakes[0].status, fakes[0].error_body = 500, "oops\n2026-01-01 INFO forged line"
        with caplog.at_level(logging.WARNING), pytest.raises(Unavailable):
            await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert not any(r.getMessage().count("\n") for r in caplog.records)

    run(test, servers=1)


def test_a_400_from_one_server_counts_against_it_and_the_other_answers() -> None:
    async def test(generator: RemoteVllmGenerator, fakes: list[FakeVllmServer]) -> None:
        first, other = _first_and_other(generator, fakes)
        first.status = 400  # e.g. priority sent to a server without --scheduling-policy priority
        chunks = await collect(generator.stream(bees_prompt(), PARAMS, "t"))
        assert chunks[-1].finished
        assert _server(generator, first).failures == 1
        other.status = 400  # both refuse: the caller's request is what they refuse
        with pytest.raises(InvalidArgument):
            await collect(generator.stream(bees_prompt("x.txt#1"), PARAMS, "t"))

    run(test, remote_breaker_failures=5)


def test_info_shows_servers_without_credentials_path_or_query() -> None:
    s = GeneratorSettings(backend="remote", remote_urls="https://user:secret@gpu-1:8443/prefix/?token=abc")
    generator = RemoteVllmGenerator(s, 4, 2.0)
    assert [state.url for state in generator.replica_states()] == ["https://gpu-1:8443"]
