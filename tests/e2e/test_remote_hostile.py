"""A real sidecar (`ragserve serve`, remote generation) beside one healthy and one hostile vLLM server
(scripted fakes on loopback, in a thread of this process): gzip bombs, streams that ignore
max_tokens, oversized lines, malformed JSON and silence. The sidecar's memory stays within 100 MiB
of its idle figure, its health stays SERVING and keeps being probed, every call answers or fails
within the stall limit, and the healthy server keeps answering. Then 64 calls stream from one URL
while health stays SERVING."""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragserve.config import GeneratorSettings
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc
from tests.e2e.servers import LiveServer, spawn_server, wait_serving
from tests.generate.fake_vllm_server import FakeVllmServer

T = TypeVar("T")
STALL_S = 2.0
QUESTIONS = [
    "How does a Bloom filter answer membership queries?",
    "What does the CAP theorem say?",
    "What is the TCP three-way handshake?",
    "How does the honey bee waggle dance encode distance?",
    "What is HNSW?",
    "What does the Linux OOM killer do?",
    "How does photosynthesis store energy?",
    "How does Raft elect a leader?",
]


class FakesOnAThread:
    """Fake vLLM servers served by an event loop of their own (the test's calls block)."""

    def __init__(self, count: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        model = GeneratorSettings().resolved_model()  # the folder the sidecar serves
        self.fakes = [self.run(FakeVllmServer(model=model).start()) for _ in range(count)]

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=60)

    def close(self) -> None:
        for fake in self.fakes:
            self.run(fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def _rss_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


class RssWatch:
    """The highest RSS a process reaches while the block runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib(self.pid))

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def sidecar(
    sample_index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, FakesOnAThread]]:
    fakes = FakesOnAThread(2)
    for fake in fakes.fakes:
        fake.words = [" word"] * 16
    env = {
        "RAGSERVE_GENERATOR_BACKEND": "remote",
        "RAGSERVE_GENERATOR_REMOTE_URLS": ",".join(f.url for f in fakes.fakes),
        "RAGSERVE_GENERATOR_REMOTE_STALL_S": str(STALL_S),
        "RAGSERVE_GENERATOR_REMOTE_BREAKER_FAILURES": "1000",  # keep routing to the hostile one
        "RAGSERVE_GENERATOR_REMOTE_HEDGE_AFTER_MS": "-1",
        "RAGSERVE_CACHE_ANSWERS": "false",
        "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
        "RAGSERVE_MAX_IN_FLIGHT": "80",
    }
    server = spawn_server(sample_index, tmp_path_factory.mktemp("hostile") / "sidecar.log", env)
    try:
        wait_serving(server)
        yield server, fakes
    finally:
        server.stop()
        fakes.close()


def _ask(target: str, question: str) -> tuple[str, float]:
    """(status code name, seconds) of one Query read to its end."""
    started = time.monotonic()
    with grpc.insecure_channel(target) as channel:
        stub = rag_pb2_grpc.RagServiceStub(channel)
        try:
            for _ in stub.Query(pb.QueryRequest(query=question, max_tokens=8), timeout=60):
                pass
            return "OK", time.monotonic() - started
        except grpc.RpcError as exc:
            return exc.code().name, time.monotonic() - started


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return int(reply.status)


def _gzip_bomb(mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(mib)) + packer.flush()


def _hostile(fake: FakeVllmServer, mode: str) -> None:
    fake.health_body, fake.health_encoding, fake.ignore_max_tokens = b"", "", False
    fake.raw_lines, fake.stall_after_words, fake.metrics_extra = None, None, b""
    if mode == "gzip-bomb":
        fake.health_body, fake.health_encoding = _gzip_bomb(512), "gzip"
        fake.metrics_extra = b"# " + b"m" * (16 << 20) + b"\n"
    elif mode == "ignores-max-tokens":
        fake.ignore_max_tokens = True
    elif mode == "oversized-line":
        fake.raw_lines = [b"data: " + b"q" * (8 << 20) + b"\n\n"]
    elif mode == "malformed-json":
        fake.raw_lines = [b'data: {"choices": [{"text": ["x"]}]}\n\n', b"data: {oops\n\n"]
    elif mode == "stalls":
        fake.stall_after_words = 1


MODES = ["gzip-bomb", "ignores-max-tokens", "oversized-line", "malformed-json", "stalls"]


def test_a_hostile_server_costs_the_sidecar_neither_memory_nor_service(
    sidecar: tuple[LiveServer, FakesOnAThread],
) -> None:
    server, fakes = sidecar
    hostile, healthy = fakes.fakes
    for question in QUESTIONS:  # warm every path once before the idle figure
        _ask(server.target, question)
    idle = _rss_mib(server.process.pid)
    report = []
    for mode in MODES:
        _hostile(hostile, mode)
        answered_before = healthy.completed
        with RssWatch(server.process.pid) as rss, ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda q: _ask(server.target, q), QUESTIONS * 2))
            time.sleep(1.5)  # three more health probes meet the hostile server
            health = _health(server.target)
        codes = [code for code, _ in results]
        report.append(f"{mode}: peak {rss.peak - idle:+.0f} MiB, {codes.count('OK')}/{len(codes)} OK")
        assert rss.peak - idle < 100, report
        assert health == health_pb2.HealthCheckResponse.SERVING, report
        assert set(codes) <= {"OK", "UNAVAILABLE"}, (mode, codes)
        assert max(seconds for _, seconds in results) < 3 * STALL_S + 5, (mode, results)
        assert healthy.completed > answered_before, mode  # the healthy server kept answering
    _hostile(hostile, "")
    # The probing went on the whole time: the hostile server is still (or again) up and asked.
    assert all(_ask(server.target, q)[0] == "OK" for q in QUESTIONS), report
    print("\n".join(report))


def test_sixty_four_calls_streaming_from_one_url_keep_health_serving(
    sidecar: tuple[LiveServer, FakesOnAThread],
) -> None:
    server, fakes = sidecar
    for fake in fakes.fakes:
        fake.token_delay_s = 0.25
    try:
        with ThreadPoolExecutor(64) as pool:
            calls = [pool.submit(_ask, server.target, QUESTIONS[0]) for _ in range(64)]  # one document: one server
            statuses = []
            for _ in range(6):
                time.sleep(0.5)
                statuses.append(_health(server.target))
            results = [call.result() for call in calls]
    finally:
        for fake in fakes.fakes:
            fake.token_delay_s = 0.0
    assert set(statuses) == {health_pb2.HealthCheckResponse.SERVING}
    assert [code for code, _ in results].count("OK") == 64
