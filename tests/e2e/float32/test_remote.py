"""Generation on real vLLM servers (`python -m vllm.entrypoints.openai.api_server`, started here on
loopback, one CPU each) and through a real vLLM router: streaming, cached tokens, answers equal to
the local engine's, aborts, routing by document, and servers dying. The last test kills the
servers: it stays last in this module."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.workloads import HttpProcess, reset_prefix_cache, spawn_router, spawn_vllm_server, wait_http_ok
from ragserve.client import RagClient
from ragserve.config import GeneratorSettings
from ragserve.generate.remote import RemoteVllmGenerator
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc
from tests.e2e.servers import (
    BASE_MODEL_ENV,
    LiveServer,
    SessionServers,
    running_requests,
    spawn_server,
    template_tokens,
    wait_serving,
    wait_warm,
)
from tests.generate import contract

# float32 on both sides: bf16 greedy decoding is not token-exact between engine layouts (limitations.md).
DTYPE = "float32"
# One question each about different sample documents (for comparing answers with the local engine).
QUESTIONS = [
    "Who discovered penicillin?",
    "How does a Bloom filter answer membership queries?",
    "What does the CAP theorem say?",
    "What does a circuit breaker do when a dependency fails?",
    "What is the TCP three-way handshake?",
    "How does the honey bee waggle dance encode distance?",
    "What is HNSW?",
    "What does the Linux OOM killer do?",
    "How does photosynthesis store energy?",
    "What drives plate tectonics?",
]


@dataclass
class RemoteStack:
    servers: list[HttpProcess]
    sidecar: LiveServer  # document routing over both servers
    local: LiveServer  # the in-process engine, for comparison


def _stop(*things: object) -> None:
    for thing in things:
        stop = getattr(thing, "stop", None)
        if stop is not None:
            stop()


@pytest.fixture(scope="module")
def stack(
    sample_index: Path, tmp_path_factory: pytest.TempPathFactory, float32_servers: SessionServers
) -> Iterator[RemoteStack]:
    logs = tmp_path_factory.mktemp("remote")
    # The folder the sidecars serve: the base model, as the float32 server it is compared with.
    model = Path(GeneratorSettings(adapter=BASE_MODEL_ENV["RAGSERVE_GENERATOR_ADAPTER"]).resolved_model())
    servers = [spawn_vllm_server(model, logs / f"vllm-{i}.log", cpus=str(i % 2), dtype=DTYPE) for i in range(2)]
    sidecar: LiveServer | None = None
    try:
        # The in-process engine to compare with: the session's float32 server (no answer cache),
        # which also serves test_speculation; taken here, its start-up overlaps the vLLM servers'.
        local = float32_servers.get("float32")
        assert local.env["RAGSERVE_GENERATOR_DTYPE"] == DTYPE and local.env["RAGSERVE_CACHE_ANSWERS"] == "false"
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(wait_http_ok, servers))
        sidecar = spawn_server(sample_index, logs / "sidecar.log", _remote_env([s.url for s in servers]))
        wait_serving(sidecar)
        # SERVING needs one server up; routing by document needs both (a server whose bring-up ran
        # past its bound, on a loaded host, joins at its next probe and takes its keys back).
        _wait_all_up(sidecar, [s.url for s in servers])
        yield RemoteStack(servers, sidecar, local)
    finally:
        _stop(sidecar, *servers)


def _wait_all_up(sidecar: LiveServer, urls: list[str], timeout_s: float = 60.0) -> None:
    async def up() -> list[str]:
        async with RagClient(sidecar.target) as client:
            return [s.url for s in (await client.info()).generator_servers if s.up]

    give_up = time.monotonic() + timeout_s
    while sorted(asyncio.run(up())) != sorted(urls):
        if time.monotonic() > give_up:
            raise AssertionError(
                f"not every generation server came up within {timeout_s:g} s: {sidecar.log_text()[-2000:]}"
            )
        time.sleep(0.2)


def _remote_env(urls: list[str], **extra: str) -> dict[str, str]:
    return {
        "RAGSERVE_GENERATOR_BACKEND": "remote",
        "RAGSERVE_GENERATOR_REMOTE_URLS": ",".join(urls),
        "RAGSERVE_CACHE_ANSWERS": "false",
        "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
        # Off: with no server up, an off-corpus question must reach the generator to fail.
        "RAGSERVE_DECLINE_FALSE_RATE": "0",
        **BASE_MODEL_ENV,
        **extra,
    }


async def _ask(target: str, question: str, **kwargs: object) -> tuple[pb.RetrievalEvent, str, pb.FinalEvent]:
    async with RagClient(target, default_timeout_s=120) as client:
        events = [e async for e in client.query(question, temperature=0.0, **kwargs)]  # type: ignore[arg-type]
    text = "".join(e.token.text for e in events if e.WhichOneof("event") == "token")
    return events[0].retrieval, text, events[-1].final


def test_answers_stream_from_the_servers_and_reuse_their_kv(stack: RemoteStack) -> None:
    first = asyncio.run(_ask(stack.sidecar.target, "How does a Bloom filter answer membership queries?", max_tokens=8))
    second = asyncio.run(_ask(stack.sidecar.target, "What is a false positive in a Bloom filter?", max_tokens=8))
    assert first[1].strip() and first[2].finish_reason in ("stop", "length")
    assert second[0].passages[0].chunk_id == first[0].passages[0].chunk_id
    # Routed to the server that answered about this passage: the template and the passage were cached.
    assert second[2].usage.prefix_cache_hit_tokens >= template_tokens() + 64, second[2].usage

    async def info() -> pb.InfoResponse:
        async with RagClient(stack.sidecar.target) as client:
            return await client.info()

    servers = asyncio.run(info()).generator_servers
    assert [(s.url, s.up) for s in servers] == [(s.url, True) for s in stack.servers]


def test_greedy_answers_equal_the_local_engines(stack: RemoteStack) -> None:
    async def both(question: str) -> tuple[str, str]:
        (_, remote, _), (_, local, _) = await asyncio.gather(
            _ask(stack.sidecar.target, question, max_tokens=32), _ask(stack.local.target, question, max_tokens=32)
        )
        return remote, local

    pairs = [asyncio.run(both(q)) for q in QUESTIONS[:6]]  # six documents (ten took 40 s of CI)
    differ = [pair for pair in pairs if pair[0] != pair[1]]
    assert len(differ) <= 1, differ


def _wait_idle(servers: list[HttpProcess], limit_s: float) -> float:
    started = time.monotonic()
    while sum(running_requests(s) for s in servers) > 0:
        if time.monotonic() - started > limit_s:
            pytest.fail(f"the servers still run {sum(running_requests(s) for s in servers)} request(s)")
        time.sleep(0.02)
    return time.monotonic() - started


# Alone: the servers, one CPU each, must end an aborted request within 1 s, and the sidecar answer in 1 s.
@pytest.mark.alone
def test_a_cancelled_stream_and_a_passed_deadline_leave_the_servers_idle(stack: RemoteStack) -> None:
    with grpc.insecure_channel(stack.sidecar.target) as channel:
        stub = rag_pb2_grpc.RagServiceStub(channel)
        call = stub.Query(pb.QueryRequest(query="Explain the water cycle in detail.", max_tokens=600), timeout=120)
        text = ""
        for event in call:
            text += event.token.text if event.WhichOneof("event") == "token" else ""
            # A server's gauge is set after it sends the step's tokens: read on until it shows the request.
            if text and sum(running_requests(s) for s in stack.servers) == 1:
                break
        else:
            pytest.fail(f"the answer ended before a server reported it running: {text!r}")
        call.cancel()
        assert _wait_idle(stack.servers, 1.0) <= 1.0
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stub.Query(
                pb.QueryRequest(query="Explain photosynthesis in detail.", max_tokens=600), timeout=1.5
            ):
                pass
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _wait_idle(stack.servers, 1.0) <= 1.0


def _second_visit_hits(target: str, pairs: list[tuple[str, str]]) -> list[int]:
    """Cached prompt tokens of the second question of each pair whose two questions retrieved the
    same top passage (the others depend on retrieval, not on routing)."""
    hits = []
    for first, second in pairs:
        a = asyncio.run(_ask(target, first, max_tokens=4))
        b = asyncio.run(_ask(target, second, max_tokens=4))
        if a[0].passages[0].chunk_id == b[0].passages[0].chunk_id:
            hits.append(b[2].usage.prefix_cache_hit_tokens)
    return hits


def test_document_routing_through_the_vllm_router_keeps_a_document_on_its_server(
    stack: RemoteStack, sample_index: Path, tmp_path: Path
) -> None:
    """The sidecar behind one URL, vLLM's router with `consistent_hash` on the sidecar's routing
    header: the second question about a document goes where the first one left its passage. (Round
    robin, which sends it to the other server, is compared in bench_remote.py.)"""
    router = spawn_router([s.url for s in stack.servers], "consistent_hash", tmp_path / "router.log")
    sidecar: LiveServer | None = None
    try:
        wait_http_ok(router)
        sidecar = spawn_server(sample_index, tmp_path / "sidecar.log", _remote_env([router.url]))
        wait_serving(sidecar)
        for server in stack.servers:  # cold caches: only this test's own questions can be reused
            reset_prefix_cache(server)
        # Each document asked about twice in a row.
        pairs = [
            ("Who discovered penicillin?", "In which year was penicillin discovered, and by whom?"),
            ("How does a Bloom filter answer membership queries?", "What is a false positive in a Bloom filter?"),
            ("What is gRPC over HTTP/2?", "Explain gRPC over HTTP/2 briefly."),
            ("What are lithium-ion batteries?", "Explain lithium-ion batteries briefly."),
            ("What are Kubernetes sidecar containers?", "Explain Kubernetes sidecar containers briefly."),
            ("What is AVX-512?", "Which SIMD instructions does AVX-512 add?"),
        ]
        hits = _second_visit_hits(sidecar.target, pairs)
    finally:
        _stop(sidecar, router)
    assert len(hits) >= 3, hits
    # The template and the whole passage were cached on the server the router chose.
    assert all(hit >= template_tokens() + 64 for hit in hits), hits


def test_the_most_retrieved_passage_is_prefilled_on_the_server_its_questions_go_to(
    stack: RemoteStack, sample_index: Path, tmp_path: Path
) -> None:
    async def top_chunk(question: str) -> str:
        async with RagClient(stack.sidecar.target) as client:
            return (await client.retrieve(question)).passages[0].chunk_id

    chunk_id = asyncio.run(top_chunk("Who discovered penicillin?"))
    counts = tmp_path / "hot-passages.json"
    counts.write_text(json.dumps({"format": 1, "counts": {chunk_id: 3}}))  # as an earlier sidecar saved them
    for server in stack.servers:
        reset_prefix_cache(server)  # nothing of this passage is cached anywhere
    sidecar = spawn_server(
        sample_index,
        tmp_path / "sidecar.log",
        _remote_env(
            [s.url for s in stack.servers], RAGSERVE_HOT_PASSAGES_PATH=str(counts), RAGSERVE_WARM_WHOLE_CORPUS="false"
        ),
    )
    try:
        wait_serving(sidecar)
        _wait_all_up(sidecar, [s.url for s in stack.servers])
        assert wait_warm(sidecar.target).passages == 1
        retrieval, _, final = asyncio.run(
            _ask(sidecar.target, "In which year was penicillin discovered, and by whom?", max_tokens=4)
        )
    finally:
        _stop(sidecar)
    assert retrieval.passages[0].chunk_id == chunk_id
    # The first question about it finds the template and the whole passage on its server.
    assert final.usage.prefix_cache_hit_tokens >= template_tokens() + 64, final.usage


def test_the_remote_generator_meets_the_generator_contract_on_a_real_vllm_server(stack: RemoteStack) -> None:
    server = stack.servers[0]

    async def run() -> None:
        adapter = BASE_MODEL_ENV["RAGSERVE_GENERATOR_ADAPTER"]  # what the stack's servers serve
        settings = GeneratorSettings(backend="remote", remote_urls=server.url, adapter=adapter)
        generator = RemoteVllmGenerator(settings, 4, 5.0)
        await generator.start()
        try:

            async def held() -> int:
                return int(await asyncio.to_thread(running_requests, server))

            await contract.run_all(generator, held)
        finally:
            await generator.close()

    asyncio.run(run())


# Alone: the sidecar must answer within 1 s with no server up.
@pytest.mark.alone
def test_servers_dying_mid_run(stack: RemoteStack) -> None:
    """Last in the module: it kills the servers."""
    target = stack.sidecar.target

    def health() -> int:
        with grpc.insecure_channel(target) as channel:
            return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status)

    answers = []
    for i, question in enumerate(QUESTIONS):
        if i == 4:
            stack.servers[0].kill()  # between requests: nothing was streaming from it
        final = asyncio.run(_ask(target, question, max_tokens=4))[2]
        answers.append(final.finish_reason)
    assert all(reason in ("stop", "length") for reason in answers)  # no request failed
    assert health() == health_pb2.HealthCheckResponse.SERVING

    stack.servers[1].kill()
    give_up = time.monotonic() + 2.0  # the probe interval is 0.5 s
    while health() == health_pb2.HealthCheckResponse.SERVING and time.monotonic() < give_up:
        time.sleep(0.05)
    assert health() == health_pb2.HealthCheckResponse.NOT_SERVING
    # No server up: a question the reader answers gets its span, flagged degraded, at once; one it
    # cannot answer gets UNAVAILABLE at once.
    started = time.monotonic()
    _, text, final = asyncio.run(_ask(target, "In which year was penicillin discovered, and by whom?", max_tokens=4))
    assert final.finish_reason == "reader" and text.strip()
    assert any("generator could not answer" in note for note in final.degraded.notes)
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(_ask(target, "What is the capital of Mongolia?", max_tokens=4))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 1.0
