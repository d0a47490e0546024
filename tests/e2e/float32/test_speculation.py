"""Prompt-lookup speculation with the engine on a server thread, over real gRPC with the real engine.

Two servers with speculation set explicitly (the default depends on the host): one this module
starts, decoding plainly with vLLM's engine-core process, and the session's float32 server with
RAGSERVE_GENERATOR_SPECULATIVE=ngram, which (layout "auto") puts the engine on a server thread.
Greedy answers must match token for token, and streaming, cancellation and deadlines must behave as
they do without speculation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.e2e.servers import (
    BASE_MODEL_ENV,
    LiveServer,
    cancel_mid_stream,
    spawn_server,
    wait_engine_idle,
    wait_serving,
)

QUESTIONS = [
    "How many bits per element does a Bloom filter need for a 1 percent false positive rate?",
    "What default values does Apache Lucene use for the BM25 parameters k1 and b?",
    "What does the TCP three-way handshake exchange between client and server?",
]
LONG_QUESTION = "Describe every step of the TLS 1.3 handshake in detail."


MODES = {"speculating": "ngram", "plain": "off"}


def _env(speculative: str) -> dict[str, str]:
    # No answer cache: every Query here must reach the engine. float32: token-for-token equality of
    # greedy answers needs it; in bf16 (chosen on hosts with native bf16) checking a draft and
    # decoding plainly, or one sequence and two at once, round differently and flip near-ties.
    return {
        **BASE_MODEL_ENV,  # the long answers a speculation comparison needs (tests/e2e/servers.py)
        "RAGSERVE_GENERATOR_SPECULATIVE": speculative,
        "RAGSERVE_CACHE_ANSWERS": "false",
        "RAGSERVE_GENERATOR_DTYPE": "float32",
    }


@pytest.fixture(scope="module")
def speculating_server(float32_server: LiveServer) -> LiveServer:
    """The session's float32 server: it is this module's speculating configuration."""
    assert _env(MODES["speculating"]).items() <= float32_server.env.items()
    return float32_server


@pytest.fixture(scope="module")
def plain_server(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = spawn_server(sample_index, tmp_path_factory.mktemp("speculation") / "plain.log", _env(MODES["plain"]))
    try:
        wait_serving(server)
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"the plain server exited with {code} on SIGTERM:\n{server.log_tail()}"


@pytest.fixture(scope="module")
def alone() -> dict[tuple[str, str], str]:
    """Greedy answers each server gave a question on its own, by (target, question): asked once in
    this module (each costs seconds of float32 decoding on a shared CI host)."""
    return {}


def _alone(answers: dict[tuple[str, str], str], target: str, question: str) -> str:
    if (target, question) not in answers:
        answers[target, question] = "".join(_answer(target, question)[0])
    return answers[target, question]


def _answer(
    target: str, question: str, request_id: str = "", timeout_s: float = 120
) -> tuple[list[str], pb.FinalEvent]:
    metadata = (("x-request-id", request_id),) if request_id else None
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        request = pb.QueryRequest(query=question, max_tokens=48, temperature=0.0)
        events = list(stub.Query(request, timeout=timeout_s, metadata=metadata))
    assert events[0].WhichOneof("event") == "retrieval" and events[-1].WhichOneof("event") == "final"
    return [e.token.text for e in events if e.WhichOneof("event") == "token"], events[-1].final


def _settings(server: LiveServer) -> dict[str, str]:
    with grpc.insecure_channel(server.target) as channel:
        info = pb_grpc.RagServiceStub(channel).Info(pb.InfoRequest(), timeout=5)
    return {s.name: s.value for s in info.generator_settings}


def test_info_names_each_layout(speculating_server: LiveServer, plain_server: LiveServer) -> None:
    speculating = _settings(speculating_server)
    assert speculating["speculative"].startswith("ngram")
    small_host = len(os.sched_getaffinity(0)) <= 4
    assert speculating["engine_layout"] == ("thread" if small_host else "process")
    plain = _settings(plain_server)
    assert (plain["speculative"], plain["engine_layout"]) == ("off", "process")


def test_greedy_answers_match_plain_decoding_and_drafts_are_accepted(
    speculating_server: LiveServer, plain_server: LiveServer, alone: dict[tuple[str, str], str]
) -> None:
    drafted = accepted = 0
    for question in QUESTIONS:
        plain_tokens, plain_final = _answer(plain_server.target, question)
        spec_tokens, spec_final = _answer(speculating_server.target, question)
        # The same text, streamed as deltas in order: nothing repeated or lost when a step accepts
        # several tokens at once.
        assert not spec_final.answer_cache_hit
        assert "".join(spec_tokens) == "".join(plain_tokens), question
        assert all(spec_tokens), "an empty delta was streamed"
        assert spec_final.usage.completion_tokens == plain_final.usage.completion_tokens
        assert plain_final.usage.draft_tokens == 0
        drafted += spec_final.usage.draft_tokens
        accepted += spec_final.usage.accepted_draft_tokens
        assert spec_final.timings.time_per_output_token_ms > 0
        alone[plain_server.target, question] = alone[speculating_server.target, question] = "".join(plain_tokens)
    assert drafted > 0 and 0 < accepted <= drafted


def test_cancel_mid_stream_aborts_the_engine_request(speculating_server: LiveServer) -> None:
    with grpc.insecure_channel(speculating_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        cancel_mid_stream(stub, LONG_QUESTION)
        # The abort waits for the engine step in progress (tens of ms) on the engine thread.
        wait_engine_idle(stub, limit_s=1.0)


def test_client_deadline_ends_the_call_and_frees_the_engine(speculating_server: LiveServer) -> None:
    with grpc.insecure_channel(speculating_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        started = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Query(pb.QueryRequest(query=LONG_QUESTION, max_tokens=600), timeout=0.6):
                pass
        elapsed = time.perf_counter() - started
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert elapsed <= 1.5, f"DEADLINE_EXCEEDED after {elapsed:.3f} s"  # room for a busy host
        wait_engine_idle(stub, limit_s=1.0)
        # The engine thread still serves the next caller.
        tokens, final = _answer(speculating_server.target, QUESTIONS[0])
        assert tokens and final.usage.completion_tokens > 0


@pytest.mark.parametrize("layout", ["speculating_server", "plain_server"])
def test_two_calls_with_one_request_id_each_get_their_own_answer(
    layout: str, request: pytest.FixtureRequest, alone: dict[tuple[str, str], str]
) -> None:
    """A client's x-request-id (a fixed one, a hedge, one copied from a log) never becomes the
    engine's id: two concurrent calls under one id each stream the answer their own question gets
    alone (not the other's, not both interleaved), and neither hangs. Both engine layouts (thread
    and engine-core process)."""
    server: LiveServer = request.getfixturevalue(layout)
    questions = QUESTIONS[1:]
    own_answers = [_alone(alone, server.target, question) for question in questions]
    assert own_answers[0] != own_answers[1]
    with ThreadPoolExecutor(len(questions)) as pool:
        calls = [pool.submit(_answer, server.target, question, "one-fixed-id", 30.0) for question in questions]
        together = [call.result() for call in calls]
    for question, own, other, (tokens, final) in zip(questions, own_answers, own_answers[::-1], together, strict=True):
        text = "".join(tokens)
        # Two sequences in one batch may round differently from one alone (a near-tie can flip a
        # token late in the answer); crossed streams interleave both answers from the first tokens.
        assert text[:24] == own[:24], (question, text, own)
        assert _similarity(text, own) > 0.9 and _similarity(text, own) > _similarity(text, other), (text, own)
        assert final.finish_reason in ("stop", "length")


def _similarity(a: str, b: str) -> float:
    from difflib import SequenceMatcher

    return SequenceMatcher(None, a, b).ratio()
