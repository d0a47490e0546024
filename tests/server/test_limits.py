"""Server-side limits a client cannot talk its way past: the call time cap, a reader that stops
reading, connection-level options, long-lived side streams and a gzip bomb.

Over the real gRPC wiring (tests/cache/inproc_server.py) with fake generators; no engine.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import ValidationError

from ragserve.config import LimitsSettings, Settings, TransportSettings, parse_caller_limits
from ragserve.errors import Overloaded
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.server.limiter import CallerLimits
from ragserve.types import RequestClass
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.cache.inproc_server import serve_pipeline
from tests.conftest import REPO
from tests.fakes import FakeEndlessGenerator

Q = "Explain how a Bloom filter answers membership queries."
# Generous bounds: they only have to separate "ended by the cap" from "never ends".
CAP_S = 2.0
NEVER_S = 20.0


@asynccontextmanager
async def served(embedder, sample_index, generator, **settings: object) -> AsyncIterator[str]:
    executor = ThreadPoolExecutor(2)
    pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), generator, executor)
    try:
        async with serve_pipeline(pipeline, Settings(**settings)) as target:  # type: ignore[arg-type]
            async with grpc.aio.insecure_channel(target) as channel:
                # Warm the embedder: a first, cold retrieval must not eat the call's time cap.
                warm_up = pb.RetrieveRequest(query=Q, budget_ms=10_000)
                await pb_grpc.RagServiceStub(channel).Retrieve(warm_up, timeout=60)
            yield target
    finally:
        executor.shutdown()


async def _in_flight(stub: pb_grpc.RagServiceStub) -> int:
    return (await stub.Info(pb.InfoRequest(), timeout=5)).requests_in_flight


async def _until(predicate, limit_s: float = NEVER_S) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.slow  # waits out the server cap
def test_a_stream_without_a_deadline_ends_at_the_server_cap(embedder, sample_index) -> None:
    generator = FakeEndlessGenerator(delay_s=0.005)

    async def body() -> None:
        async with (
            served(embedder, sample_index, generator, limits=LimitsSettings(max_call_s=CAP_S)) as target,
            grpc.aio.insecure_channel(target) as channel,
        ):
            stub = pb_grpc.RagServiceStub(channel)
            call = stub.Query(pb.QueryRequest(query=Q, budget_ms=10_000))  # no deadline
            tokens = 0
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async with asyncio.timeout(NEVER_S):
                    async for event in call:
                        tokens += event.HasField("token")
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "RAGSERVE_MAX_CALL_S" in (info.value.details() or "")
            assert tokens > 0
            # The engine request was aborted and the slot freed.
            assert generator.opened == generator.closed == 1
            assert await _in_flight(stub) == 0

    asyncio.run(body())


@pytest.mark.slow  # waits out a stalled reader
def test_a_client_that_stops_reading_frees_its_slot(embedder, sample_index) -> None:
    # 16 KiB pieces fill the HTTP/2 windows and socket buffers fast: the server's write then blocks.
    generator = FakeEndlessGenerator(piece="x" * 16_384)

    async def body() -> None:
        async with (
            served(embedder, sample_index, generator, limits=LimitsSettings(max_call_s=CAP_S)) as target,
            grpc.aio.insecure_channel(target) as stalled,
            grpc.aio.insecure_channel(target) as other,
        ):
            observer = pb_grpc.RagServiceStub(other)
            call = pb_grpc.RagServiceStub(stalled).Query(pb.QueryRequest(query=Q, budget_ms=10_000))
            first = await call.read()
            assert first.HasField("retrieval")
            assert await _in_flight(observer) == 1
            # The client reads nothing more; the slot must come back anyway.
            assert await _until(lambda: _count_is(observer, 0)), "a stalled reader still holds its slot"
            assert await _until(lambda: _true(generator.closed == 1)), "the engine request was not aborted"
            # Reading again, the client finds the stream ended by the cap.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async with asyncio.timeout(NEVER_S):
                    while await call.read() is not grpc.aio.EOF:
                        pass
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(body())


async def _count_is(stub: pb_grpc.RagServiceStub, expected: int) -> bool:
    return await _in_flight(stub) == expected


async def _true(value: bool) -> bool:
    return value


def _http2_frames(sock: socket.socket, limit_s: float) -> tuple[list[tuple[int, bytes]], bool]:
    """Frames (type, payload) the server sends until it closes the connection or `limit_s` passes."""
    sock.settimeout(0.2)
    data = b""
    closed = False
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[9 : 9 + length]))
        data = data[9 + length :]
    return frames, closed


def test_connections_get_a_stream_limit_and_idle_ones_are_closed(embedder, sample_index) -> None:
    async def body() -> None:
        settings = {"transport": {"max_concurrent_streams": 100, "max_connection_idle_ms": 300}}
        async with served(embedder, sample_index, None, **settings) as target:
            host, port = target.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as sock:
                # The HTTP/2 client preface and an empty SETTINGS frame; then nothing at all.
                sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                frames, closed = await asyncio.to_thread(_http2_frames, sock, NEVER_S)
        settings_frames = [payload for kind, payload in frames if kind == 0x4 and payload]
        advertised = {}
        for payload in settings_frames:
            for offset in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[offset : offset + 6])
                advertised[key] = value
        assert advertised.get(0x3) == 100  # SETTINGS_MAX_CONCURRENT_STREAMS
        assert any(kind == 0x7 for kind, _ in frames), "no GOAWAY for an idle connection"
        assert closed

    asyncio.run(body())


def test_side_streams_have_their_own_bound(embedder, sample_index) -> None:
    async def body() -> None:
        async with (
            served(embedder, sample_index, None, limits=LimitsSettings(max_side_streams=2)) as target,
            grpc.aio.insecure_channel(target) as channel,
        ):
            # Reflection (an async-generator handler) runs through the same bound.
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            listing = reflection.ServerReflectionInfo()
            await listing.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            services = (await listing.read()).list_services_response.service
            assert "ragserve.v1.RagService" in {service.name for service in services}
            await listing.done_writing()
            assert await listing.read() is grpc.aio.EOF
            health = health_pb2_grpc.HealthStub(channel)
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(2)]
            for watch in watches:
                await watch.read()  # open and answered
            third = health.Watch(health_pb2.HealthCheckRequest())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async with asyncio.timeout(NEVER_S):
                    await third.read()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Unary health checks and Info are not held open and stay available.
            await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert await _in_flight(pb_grpc.RagServiceStub(channel)) == 0
            watches[0].cancel()
            fourth = health.Watch(health_pb2.HealthCheckRequest())
            assert await _until(lambda: _reads(fourth)), "a closed watch did not give its place back"

    asyncio.run(body())


async def _reads(call: grpc.aio.UnaryStreamCall) -> bool:
    try:
        await call.read()
        return True
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False


def test_stream_limit_below_the_in_flight_bound_is_refused() -> None:
    with pytest.raises(ValidationError, match="RAGSERVE_MAX_CONCURRENT_STREAMS"):
        Settings(
            limits=LimitsSettings(max_in_flight=64, max_side_streams=16),
            transport=TransportSettings(max_concurrent_streams=70),
        )


_OPTIONS_ONLY_SERVER = textwrap.dedent(
    """
    import asyncio, grpc
    from ragserve.config import AnswerSettings, Settings
    from ragserve.server.app import make_front
    from ragserve.server.grpc.server import server_options
    from ragserve.server.grpc.servicer import RagServicer
    from ragserve.v1 import rag_pb2_grpc as pb_grpc

    async def main():
        settings = Settings(answer=AnswerSettings(generation_enabled=False))
        server = grpc.aio.server(options=server_options(settings))
        pb_grpc.add_RagServiceServicer_to_server(RagServicer(make_front(settings)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
    """
)


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match
    return int(match.group(1)) / 1024


@pytest.mark.slow  # a server child process, and a 128 MiB request compressed on the client
def test_a_gzip_bomb_is_refused_without_inflating(tmp_path: Path) -> None:
    """128 MiB of one letter gzips to ~130 KiB: refused on its decompressed size, in bounded memory."""
    inflated = 128 * 2**20
    server = subprocess.Popen([sys.executable, "-c", _OPTIONS_ONLY_SERVER], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = _peak_rss_mib(server.pid)

        def bomb(_: object) -> bytes:
            # A RetrieveRequest whose query (field 1) is `inflated` bytes long, serialized by hand.
            length = bytearray()
            n = inflated
            while n >= 0x80:
                length.append((n & 0x7F) | 0x80)
                n >>= 7
            length.append(n)
            return b"\x0a" + bytes(length) + b"a" * inflated

        with grpc.insecure_channel(f"127.0.0.1:{port}", compression=grpc.Compression.Gzip) as channel:
            retrieve = channel.unary_unary(
                "/ragserve.v1.RagService/Retrieve",
                request_serializer=bomb,
                response_deserializer=pb.RetrieveResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as info:
                retrieve(None, timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        grown = _peak_rss_mib(server.pid) - before
        assert grown < 48, f"the server's peak memory grew {grown:.0f} MiB for a {inflated >> 20} MiB bomb"
    finally:
        server.kill()
        server.wait()


def test_caller_limits_cap_a_callers_class_and_calls() -> None:
    """RAGSERVE_CALLER_LIMITS: a named caller runs at most at its class and within its cap; `*` is
    everyone else; without the setting the class is the caller's word."""
    limits = CallerLimits(parse_caller_limits("reports=batch:1,web=interactive:2,*=batch:1"), 100)
    with limits.admit({"reports", "other-san"}, RequestClass.INTERACTIVE) as granted:
        assert granted is RequestClass.BATCH  # asked above its class: served at its class
        with pytest.raises(Overloaded, match="reports"), limits.admit({"reports"}, RequestClass.BATCH):
            pass
    with limits.admit({"web"}, RequestClass.INTERACTIVE) as granted, limits.admit({"web"}, RequestClass.BATCH) as b:
        assert granted is RequestClass.INTERACTIVE and b is RequestClass.BATCH  # asking lower is fine
    with limits.admit(set(), RequestClass.INTERACTIVE) as granted:  # no certificate: `*`
        assert granted is RequestClass.BATCH
    with CallerLimits({}, 100).admit(set(), RequestClass.INTERACTIVE) as granted:
        assert granted is RequestClass.INTERACTIVE
    for bad in ("web=urgent:2", "web=batch", "=batch:1", "web=batch:0", "web=batch:2,web=interactive:9"):
        with pytest.raises(ValidationError, match="RAGSERVE_CALLER_LIMITS"):
            LimitsSettings(caller_limits=bad)


def test_a_certificate_with_several_named_names_gets_the_most_restrictive_pair() -> None:
    limits = CallerLimits(parse_caller_limits("a-web=interactive:48,b-job=batch:4,c-job=batch:1"), 100)
    with limits.admit({"a-web", "b-job"}, RequestClass.INTERACTIVE) as granted:
        assert granted is RequestClass.BATCH  # not the alphabetically first name's class
    # c-job's cap of 1 binds, not b-job's 4.
    with (
        limits.admit({"b-job", "c-job"}, RequestClass.BATCH),
        pytest.raises(Overloaded, match="c-job"),
        limits.admit({"c-job"}, RequestClass.BATCH),
    ):
        pass


def test_a_caller_past_its_cap_is_refused_over_grpc(embedder, sample_index) -> None:
    async def run() -> grpc.StatusCode:
        generator = FakeEndlessGenerator(delay_s=0.05)
        limits = LimitsSettings(caller_limits="*=batch:1")
        async with (
            served(embedder, sample_index, generator, limits=limits) as target,
            grpc.aio.insecure_channel(target) as channel,
        ):
            stub = pb_grpc.RagServiceStub(channel)
            first = stub.Query(pb.QueryRequest(query=Q, max_tokens=8), timeout=30)
            await first.read()  # the retrieval event: the first call is in
            try:
                await stub.Retrieve(pb.RetrieveRequest(query=Q), timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            finally:
                first.cancel()
            return grpc.StatusCode.OK

    assert asyncio.run(run()) == grpc.StatusCode.RESOURCE_EXHAUSTED
