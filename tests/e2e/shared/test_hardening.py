"""The service's promises under faults, each against a real server process (see docs/promises.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.e2e.servers import LiveServer, cancel_mid_stream, spawn_server, wait_engine_idle, wait_serving

LONG_QUESTION = "Describe every step of the TLS 1.3 handshake in detail."


def _stub(target: str) -> tuple[grpc.Channel, pb_grpc.RagServiceStub]:
    channel = grpc.insecure_channel(target)
    return channel, pb_grpc.RagServiceStub(channel)


# 1. Cancellation
def test_cancel_mid_stream_aborts_the_engine_request(live_server: LiveServer) -> None:
    channel, stub = _stub(live_server.target)
    with channel:
        cancel_mid_stream(stub, LONG_QUESTION)
        # The answer would run for seconds; the bound leaves room for a busy two-core host.
        wait_engine_idle(stub, limit_s=1.0)


# 2. Deadlines
def test_client_deadline_ends_a_stalled_call_and_frees_the_engine(live_server: LiveServer) -> None:
    channel, stub = _stub(live_server.target)
    with channel:
        started = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Query(pb.QueryRequest(query=LONG_QUESTION, max_tokens=600), timeout=0.2):
                pass
        elapsed = time.perf_counter() - started
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The client's clock ends the call; a loaded two-core host was seen to deliver it 105 ms late,
        # so the bound only proves the call did not run on towards its seconds-long answer.
        assert elapsed <= 1.0, f"DEADLINE_EXCEEDED after {elapsed:.3f} s"
        wait_engine_idle(stub, limit_s=1.0)


# 3. Overload
def test_overload_is_rejected_fast_with_pushback(live_server: LiveServer) -> None:
    limit = int(live_server.env["RAGSERVE_MAX_IN_FLIGHT"])
    channel, stub = _stub(live_server.target)
    with channel:
        calls = [stub.Query(pb.QueryRequest(query=LONG_QUESTION, max_tokens=600), timeout=120) for _ in range(limit)]
        try:
            for call in calls:
                next(iter(call))  # the retrieval event: this call is admitted and in flight
            started = time.perf_counter()
            with pytest.raises(grpc.RpcError) as info:
                stub.Retrieve(pb.RetrieveRequest(query="one more"), timeout=5)
            elapsed = time.perf_counter() - started
        finally:
            for call in calls:
                call.cancel()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Rejected without queueing behind the admitted streams (each runs for seconds). The bound is
        # loose on purpose: typically a few ms, but 11.8 ms was seen on a busy 2-core host.
        assert elapsed < 0.25, f"rejection took {elapsed * 1000:.1f} ms"
        trailers = dict(info.value.trailing_metadata() or ())
        assert int(trailers["grpc-retry-pushback-ms"]) > 0
        wait_engine_idle(stub, limit_s=2.0)
        # Capacity comes back once the streams are gone.
        assert stub.Retrieve(pb.RetrieveRequest(query="one more"), timeout=5).passages


# 4. Slow readers
def test_slow_reader_does_not_grow_server_memory(live_server: LiveServer) -> None:
    process = psutil.Process(live_server.process.pid)
    channel, stub = _stub(live_server.target)
    with channel:
        before = process.memory_info().rss
        call = stub.Query(pb.QueryRequest(query=LONG_QUESTION, max_tokens=200), timeout=120)
        events = iter(call)
        next(events)
        time.sleep(4.0)  # the client reads nothing while the engine could produce ~100 tokens
        # Meanwhile others are served normally.
        assert stub.Retrieve(pb.RetrieveRequest(query="Bloom filter"), timeout=5).passages
        grown_mb = (process.memory_info().rss - before) / 2**20
        rest = list(events)
        assert rest[-1].WhichOneof("event") == "final"
    assert grown_mb < 64, f"server RSS grew {grown_mb:.1f} MiB while a reader stalled"


# 7. Bad input (the property-based part is in test_fuzz_input.py)
def test_oversized_message_is_resource_exhausted(retrieval_server: LiveServer) -> None:
    channel, stub = _stub(retrieval_server.target)
    with channel:
        with pytest.raises(grpc.RpcError) as info:
            stub.Retrieve(pb.RetrieveRequest(query="x" * (5 * 1024 * 1024)), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Retrieve(pb.RetrieveRequest(query="still fine"), timeout=5).passages


# 9. Port safety
def test_second_server_on_the_same_port_fails_fast(retrieval_server: LiveServer, sample_index: Path) -> None:
    port = retrieval_server.target.rsplit(":", 1)[1]
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "serve", "--port", port, "--index", str(sample_index)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RAGSERVE_GENERATION_ENABLED": "false", "RAGSERVE_METRICS_PORT": "0"},
    )
    assert result.returncode == 2
    assert "in use" in result.stderr and "RAGSERVE_PORT" in result.stderr  # one line of ours, naming the fix
    assert "Traceback" not in result.stderr and "add_port" not in result.stderr
    assert time.perf_counter() - started < 30
    channel, stub = _stub(retrieval_server.target)
    with channel:
        assert stub.Retrieve(pb.RetrieveRequest(query="still the first server"), timeout=5).passages


# 10. Keepalive
def test_long_lived_channel_survives_several_keepalive_periods(live_server: LiveServer) -> None:
    options = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_timeout_ms", 2000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(live_server.target, options=options) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        assert stub.Info(pb.InfoRequest(), timeout=5).index_chunks > 0
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append, try_to_connect=False)
        time.sleep(6.0)  # six client keepalive periods, idle
        assert stub.Info(pb.InfoRequest(), timeout=5).index_chunks > 0
        channel.unsubscribe(states.append)
    # A GOAWAY for pinging too often would have dropped the connection (TRANSIENT_FAILURE or IDLE).
    assert grpc.ChannelConnectivity.TRANSIENT_FAILURE not in states
    assert grpc.ChannelConnectivity.IDLE not in states


# 11. Untrusted documents: the logs name documents, never their text or the question
def test_logs_carry_ids_not_text(live_server: LiveServer) -> None:
    question = "Which gas do plants release during photosynthesis, exactly?"
    channel, stub = _stub(live_server.target)
    with channel:
        response = stub.Retrieve(pb.RetrieveRequest(query=question, top_k=2), timeout=10)
        for _ in stub.Query(pb.QueryRequest(query=question, max_tokens=4), timeout=60):
            pass
    time.sleep(0.2)
    log = live_server.log_text()
    assert "photosynthesis.md" in log  # the document id is logged
    assert question not in log
    for passage in response.passages:
        snippet = passage.text.strip().splitlines()[-1][:60]
        assert snippet and snippet not in log


@pytest.fixture(scope="module")
def own_servers(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveServer]]:
    """The two full servers of their own the tests below stop or break, started at once on first
    use (the second start-up overlaps the first test)."""
    folder = tmp_path_factory.mktemp("own-servers")
    envs = {
        # For the graceful-shutdown test: it stops this one.
        "disposable": {
            "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
            "RAGSERVE_HOT_PASSAGES_PATH": str(folder / "hot.json"),
        },
        # The engine core in a process of its own (what the engine-failure test kills; with the
        # engine on a server thread, tests/generate covers a failing engine).
        "process-layout": {
            "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
            # Off: the engine-failure test needs an off-corpus question to reach the dead engine.
            "RAGSERVE_DECLINE_FALSE_RATE": "0",
            "RAGSERVE_GENERATOR_ENGINE_LAYOUT": "process",
            "RAGSERVE_GENERATOR_SPECULATIVE": "off",
        },
    }
    started = {name: spawn_server(sample_index, folder / f"{name}.log", env) for name, env in envs.items()}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def disposable_server(own_servers: dict[str, LiveServer]) -> LiveServer:
    """A full server of its own, for a test that stops it."""
    wait_serving(own_servers["disposable"])
    return own_servers["disposable"]


# 5. Graceful shutdown (the retrieval counts are saved on the way out, for the next server's warming)
def test_sigterm_drains_in_flight_streams_and_exits_zero(disposable_server: LiveServer) -> None:
    server = disposable_server
    channel, stub = _stub(server.target)
    with channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=120)
        watch_iter = iter(watch)
        assert next(watch_iter).status == health_pb2.HealthCheckResponse.SERVING
        stream = stub.Query(pb.QueryRequest(query="What is a Bloom filter?", max_tokens=40), timeout=120)
        events = iter(stream)
        first = next(events)
        assert first.WhichOneof("event") == "retrieval"

        signalled = time.perf_counter()
        server.process.send_signal(signal.SIGTERM)
        assert next(watch_iter).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert time.perf_counter() - signalled < 1.0

        # The in-flight stream runs to its end inside the grace period.
        rest = list(events)
        assert rest and rest[-1].WhichOneof("event") == "final"

    # New calls are refused once the server is stopping.
    with grpc.insecure_channel(server.target) as fresh:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.RagServiceStub(fresh).Retrieve(pb.RetrieveRequest(query="late"), timeout=3)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    server.process.wait(timeout=30)
    assert server.process.returncode == 0, server.log_tail()
    counts = json.loads(Path(server.env["RAGSERVE_HOT_PASSAGES_PATH"]).read_text())["counts"]
    assert counts == {first.retrieval.passages[0].chunk_id: 1}


@pytest.fixture
def process_layout_server(own_servers: dict[str, LiveServer]) -> LiveServer:
    """A full server whose engine core runs in a process of its own, for a test that kills it."""
    wait_serving(own_servers["process-layout"])
    return own_servers["process-layout"]


def _engine_core(server: LiveServer) -> psutil.Process:
    for child in psutil.Process(server.process.pid).children(recursive=True):
        if "EngineCore" in " ".join([child.name(), *child.cmdline()]):
            return child
    pytest.fail("no vLLM EngineCore child process found")


# 6. Engine failure
# Over the sample documents the shipped reader answers the first and declines the second, both far
# from its threshold (margins of about +11 and -9 against 0.73 when this was written).
ANSWERABLE = "In which year was penicillin discovered, and by whom?"
OFF_CORPUS = "What is the capital of Mongolia?"


def test_dead_engine_fails_streams_and_health_but_not_retrieve(process_layout_server: LiveServer) -> None:
    server = process_layout_server
    channel, stub = _stub(server.target)
    with channel:
        stream = stub.Query(pb.QueryRequest(query=LONG_QUESTION, max_tokens=600), timeout=120)
        events = iter(stream)
        assert next(events).WhichOneof("event") == "retrieval"
        _engine_core(server).kill()
        # An error status, or (no token yet, and the reader's span answers) that span flagged
        # degraded: never a stream that just stops.
        try:
            rest = list(events)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
        else:
            final = rest[-1].final
            assert final.finish_reason == "reader" and any("generator" in n for n in final.degraded.notes)

        health = health_pb2_grpc.HealthStub(channel)
        give_up = time.monotonic() + 10
        status = None
        while time.monotonic() < give_up:
            status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            time.sleep(0.2)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        retrieve_health = health.Check(
            health_pb2.HealthCheckRequest(service="ragserve.v1.RagService/Retrieve"), timeout=5
        )
        assert retrieve_health.status == health_pb2.HealthCheckResponse.SERVING
        assert stub.Retrieve(pb.RetrieveRequest(query="Bloom filter"), timeout=5).passages
        # With the engine dead, a question the reader answers gets its span, flagged degraded,
        # within the retrieval budget's order of time; one it cannot answer gets UNAVAILABLE.
        started = time.monotonic()
        answered = list(stub.Query(pb.QueryRequest(query=ANSWERABLE, max_tokens=5), timeout=30))
        assert time.monotonic() - started < 1.0
        final = answered[-1].final
        assert final.finish_reason == "reader" and any("generator" in n for n in final.degraded.notes)
        assert "".join(e.token.text for e in answered if e.WhichOneof("event") == "token").strip()
        with pytest.raises(grpc.RpcError) as again:
            list(stub.Query(pb.QueryRequest(query=OFF_CORPUS, max_tokens=5), timeout=30))
        assert again.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.process.poll() is None, "the server process must survive its engine"
