"""The OpenAI-compatible door of a real server (the real engine): the official `openai` package,
streaming and not, with nothing but `base_url`; `curl`; and the contract between the two doors: one
question gives the same answer and passages through gRPC and HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time

import grpc
import openai
import pytest

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.e2e.servers import LiveServer, wait_engine_idle

pytestmark = pytest.mark.e2e

# Questions no other test asks (the shared server's answer cache outlives each test).
HTTP_FIRST = "What did Alexander Fleming notice on the culture plates he had left on his bench?"
GRPC_FIRST = "How does a honey bee tell the others where the flowers are?"
MAX_TOKENS = 200
# Asks until the server stores an answer (a loaded host's budget can cut retrieval short).
ASKS = 3


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=120)


async def _grpc_answer(
    server: LiveServer, question: str, history: list[tuple[str, str]]
) -> tuple[str, list[str], pb.FinalEvent, bool]:
    """The answer, its passages, its final event, and whether the server stored it (it finished by
    itself and retrieval cut nothing short)."""
    async with RagClient(server.target, default_timeout_s=120) as client:
        events = [e async for e in client.query(question, max_tokens=MAX_TOKENS, temperature=0.0, history=history)]
    text = "".join(e.token.text for e in events if e.WhichOneof("event") == "token")
    final, degraded = events[-1].final, events[0].retrieval.degraded.ListFields()
    stored = not final.answer_cache_hit and final.finish_reason == "stop" and not degraded
    return text, [p.chunk_id for p in events[0].retrieval.passages], final, stored


def _http_until_stored(server: LiveServer, question: str) -> openai.types.chat.ChatCompletion:
    """The HTTP door's answer once the server stored one: on a loaded host the retrieval budget
    can run out, and a degraded answer is (rightly) never stored; the next ask tries again."""
    for _ in range(ASKS):
        reply = _client(server).chat.completions.create(
            model="ragserve", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": question}]
        )
        extra = reply.model_extra["ragserve"]
        assert not extra["final"].get("answer_cache_hit", False)
        if extra["final"]["finish_reason"] == "stop" and not extra["retrieval"].get("degraded"):
            return reply
    pytest.fail(f"no stored answer in {ASKS} asks: {extra}")


def test_the_same_question_gets_the_same_answer_and_passages_through_both_doors(live_server: LiveServer) -> None:
    # HTTP first: the engine answers it; gRPC then finds that very answer under the same key.
    reply = _http_until_stored(live_server, HTTP_FIRST)
    extra = reply.model_extra["ragserve"]
    text, passages, final, _ = asyncio.run(_grpc_answer(live_server, HTTP_FIRST, []))
    assert final.answer_cache_hit, "gRPC did not find the HTTP door's answer: the doors built different requests"
    assert text == reply.choices[0].message.content and text.strip()
    assert passages == [p["chunk_id"] for p in extra["retrieval"]["passages"]]

    # gRPC first, with a history: the HTTP door's streamed answer is the same one.
    history = [("user", "What do honey bees do?"), ("assistant", "They gather nectar and pollen [1].")]
    for _ in range(ASKS):
        text, passages, final, stored = asyncio.run(_grpc_answer(live_server, GRPC_FIRST, history))
        assert not final.answer_cache_hit and text.strip()
        if stored:
            break
    else:
        pytest.fail(f"no stored answer in {ASKS} asks: {final}")
    stream = _client(live_server).chat.completions.create(
        model="ragserve",
        max_tokens=MAX_TOKENS,
        stream=True,
        messages=[
            {"role": "user", "content": history[0][1]},
            {"role": "assistant", "content": history[1][1]},
            {"role": "user", "content": GRPC_FIRST},
        ],
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [p["chunk_id"] for p in chunks[0].model_extra["ragserve"]["retrieval"]["passages"]] == passages
    streamed_final = next(
        c.model_extra["ragserve"]["final"] for c in chunks if "final" in (c.model_extra or {}).get("ragserve", {})
    )
    assert streamed_final.get("answer_cache_hit"), streamed_final


def test_the_openai_package_streams_tokens_from_the_engine(live_server: LiveServer) -> None:
    started = time.perf_counter()
    arrivals = []
    stream = _client(live_server).chat.completions.create(
        model="ragserve",
        stream=True,
        temperature=0.7,  # not cached: the engine streams it now
        max_tokens=48,
        messages=[{"role": "user", "content": "Why is the sky's water cycle driven by the sun?"}],
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - started)
    # Token by token as the engine decodes (tens of ms each here), not one body at the end.
    assert len(arrivals) >= 2 and arrivals[-1] - arrivals[0] > 0.05, arrivals


def test_a_client_gone_aborts_the_engine_request(live_server: LiveServer) -> None:
    stream = _client(live_server).chat.completions.create(
        model="ragserve",
        stream=True,
        max_tokens=600,
        temperature=0.7,
        messages=[{"role": "user", "content": "Explain everything about TLS 1.3 handshakes in detail."}],
    )
    tokens = 0
    for chunk in stream:
        tokens += bool(chunk.choices and chunk.choices[0].delta.content)
        if tokens == 3:
            break
    with grpc.insecure_channel(live_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        assert stub.Info(pb.InfoRequest(), timeout=5).generator_unfinished_requests == 1
        stream.close()
        wait_engine_idle(stub, limit_s=5.0)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_gets_a_whole_completion_and_an_openai_error(live_server: LiveServer) -> None:
    url = f"{live_server.openai_url}/chat/completions"
    body = {"messages": [{"role": "user", "content": "What is Little's law?"}], "max_tokens": 32}
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "120", url, "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reply = json.loads(out)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["content"].strip()
    assert reply["ragserve"]["retrieval"]["passages"]
    bad = subprocess.run(
        [
            "curl",
            "-sS",
            "-w",
            "\n%{http_code}",
            url,
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"messages": [{"role": "user", "content": 3}]}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    text, _, status = bad.rpartition("\n")
    assert status == "400" and json.loads(text)["error"]["param"] == "messages[0].content"


def test_grpc_refuses_a_turn_without_a_role(live_server: LiveServer) -> None:
    with grpc.insecure_channel(live_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        request = pb.QueryRequest(query="And then?", history=[pb.Turn(text="hello")])
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Query(request, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "history[0].role" in (refused.value.details() or "")
