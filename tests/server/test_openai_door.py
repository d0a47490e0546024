"""The OpenAI-compatible door in process: the real `openai` package and `curl` against it, over the
real embedder and index and a generator fake (named as such). The real engine behind the same door,
and the two doors agreeing, are in tests/e2e/shared/test_openai_door.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.types import ASGIApp

from ragserve.config import Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.server.app import make_front
from ragserve.server.front import Front
from ragserve.server.http.app import http_app
from ragserve.server.http.listener import HttpListener
from ragserve.server.openai.door import OpenAIDoor
from tests.certs import make_pki
from tests.fakes import FakeGenerator
from tests.helpers import free_port

TOKEN = "door-test-token"
JSON = "Content-Type: application/json"


@dataclass
class Door:
    url: str
    generator: FakeGenerator
    loop: asyncio.AbstractEventLoop

    def client(self, token: str = TOKEN, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=token, max_retries=0, **options)


def openai_app(settings: Settings, front: Front) -> ASGIApp:
    """The HTTP app with the OpenAI door's routes alone, as the server builds it."""
    return http_app(OpenAIDoor(settings, front).routes, front.identity, settings.http)


@contextlib.contextmanager
def serving(settings: Settings, app: ASGIApp) -> Iterator[asyncio.AbstractEventLoop]:
    """The app on the HTTP listener, on its own event loop in a thread, as the server runs it,
    until the block ends."""
    started = threading.Event()
    box: list[Any] = []

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            box.extend([asyncio.get_running_loop(), stop])
            listener = HttpListener(app, "127.0.0.1", settings.http.port, settings)
            await listener.start()
            started.set()
            await stop.wait()
            await listener.close()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30), "the door did not start"
    try:
        yield box[0]
    finally:
        box[0].call_soon_threadsafe(box[1].set)
        thread.join(30)


@pytest.fixture(scope="module")
def door(sample_index: Path, embedder: SentenceTransformerEmbedder) -> Iterator[Door]:
    settings = Settings(
        http={"port": free_port()},
        access={"auth_token": TOKEN},
        limits={"max_in_flight": 2, "max_call_s": 5.0},
        history={"max_history_turns": 4, "max_turn_chars": 200},
    )
    generator = FakeGenerator(words=["Fleming ", "found ", "it ", "[1]."])
    executor = ThreadPoolExecutor(2)
    pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), generator, executor)
    with serving(settings, openai_app(settings, make_front(settings, pipeline))) as loop:
        yield Door(f"http://127.0.0.1:{settings.http.port}", generator, loop)
    executor.shutdown()


def test_the_openai_package_gets_an_answer_with_passages(door: Door) -> None:
    reply = door.client().chat.completions.create(
        model="ragserve", messages=[{"role": "user", "content": "Who discovered penicillin?"}]
    )
    assert reply.choices[0].message.content == "Fleming found it [1]."
    assert reply.choices[0].finish_reason == "stop"
    extra = reply.model_extra["ragserve"]
    assert "penicillin" in extra["retrieval"]["passages"][0]["doc_id"]
    assert extra["final"]["finish_reason"] == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_fields_at_the_values_that_ask_for_nothing_pass(door: Door) -> None:
    reply = door.client().chat.completions.create(
        model="ragserve",
        messages=[{"role": "user", "content": "Who discovered penicillin?"}],
        response_format={"type": "text"},
        tool_choice="none",
        logprobs=False,
        stop=[],
    )
    assert reply.choices[0].message.content == "Fleming found it [1]."


def test_the_openai_package_streams_with_passages_first_and_a_history(door: Door) -> None:
    stream = door.client().chat.completions.create(
        model="anything",
        stream=True,
        stream_options={"include_usage": True},
        messages=[
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What do honey bees do?"},
            {"role": "assistant", "content": "They forage [1]."},
            {"role": "user", "content": [{"type": "text", "text": "How do they communicate?"}]},
        ],
    )
    chunks = list(stream)
    first = chunks[0].model_extra["ragserve"]
    assert "bee" in first["retrieval"]["passages"][0]["doc_id"]  # "they" found through the history
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Fleming found it [1]."
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[0].choices[0].finish_reason == "stop" and "final" in finals[0].model_extra["ragserve"]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    prompt = door.generator.prompts[-1].user
    assert "User: What do honey bees do?" in prompt and "You are helpful" not in prompt


def _curl(door: Door, *args: str) -> tuple[int, str, dict[str, str]]:
    out = subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "30", *args], capture_output=True, text=True, check=True
    ).stdout
    head, _, body = out.partition("\n\n")  # text mode reads CRLF as LF
    lines = head.split("\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), body, headers


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_server_sent_events(door: Door) -> None:
    body = {"model": "ragserve", "stream": True, "messages": [{"role": "user", "content": "Who found penicillin?"}]}
    status, text, headers = _curl(
        door,
        "-N",
        f"{door.url}/v1/chat/completions",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(body),
    )
    assert status == 200, text
    assert headers.get("content-type", repr(headers)).startswith("text/event-stream"), text[:300]
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and "retrieval" in chunks[0]["ragserve"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Fleming found it [1]."


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ('{"messages": [', 400, "body"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', 400, "messages[0].role"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
            400,
            "messages[1].role",
        ),
        ('{"messages": [{"role": "user", "content": "   "}]}', 400, "messages[0].content"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x" * 201}, {"role": "user", "content": "q"}]}),
            400,
            "messages[0].text",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "q"}] * 6}), 400, "messages"),
        ('{"messages": [{"role": "user", "content": "q"}], "temperature": 9}', 400, "temperature"),
        ('{"messages": [{"role": "user", "content": "q"}], "n": 2}', 400, "n"),
        # Fields that change what an answer means are refused, never silently ignored.
        ('{"messages": [{"role": "user", "content": "q"}], "stop": ["."]}', 400, "stop"),
        ('{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]}', 400, "tools"),
        ('{"messages": [{"role": "user", "content": "q"}], "tool_choice": "required"}', 400, "tool_choice"),
        (
            '{"messages": [{"role": "user", "content": "q"}], "response_format": {"type": "json_object"}}',
            400,
            "response_format",
        ),
        ('{"messages": [{"role": "user", "content": "q"}], "logprobs": true}', 400, "logprobs"),
    ],
)
def test_bad_input_gets_400_with_an_openai_error_naming_the_field(
    door: Door, body: str, status: int, param: str
) -> None:
    code, text, _ = _curl(
        door, f"{door.url}/v1/chat/completions", "-H", f"Authorization: Bearer {TOKEN}", "-H", JSON, "-d", body
    )
    error = json.loads(text)["error"]
    assert code == status, text
    assert error["param"] == param and error["type"] == "invalid_request_error" and "Traceback" not in text


def test_a_bad_token_is_401_and_an_unknown_path_404(door: Door) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        door.client(token="wrong").models.list()
    assert refused.value.status_code == 401 and refused.value.body["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError):
        door.client().completions.create(model="ragserve", prompt="legacy completions are not served")
    assert [m.id for m in door.client().models.list()] == ["ragserve"]


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_overload_is_429_with_retry_after(door: Door) -> None:
    door.generator.delay_s = 0.3  # two calls hold both slots while a third arrives
    try:
        client = door.client()
        ask = lambda: client.chat.completions.create(  # noqa: E731
            model="ragserve", messages=[{"role": "user", "content": "What is HTTP/2 multiplexing?"}]
        )
        before = door.generator.calls
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(ask) for _ in range(2)]
            assert asyncio.run(_wait_for(lambda: door.generator.calls >= before + 2, 20.0))
            with pytest.raises(openai.RateLimitError) as shed:
                ask()
            for h in held:
                h.result()
    finally:
        door.generator.delay_s = 0.0
    assert shed.value.status_code == 429
    assert int(shed.value.response.headers["retry-after"]) >= 1


@pytest.mark.slow  # waits out the server's call limit
def test_past_the_servers_call_limit_is_504(door: Door) -> None:
    door.generator.delay_s = 2.0  # 4 words: past RAGSERVE_MAX_CALL_S (5 s) before the last
    try:
        with pytest.raises(openai.APIStatusError) as late:
            door.client().chat.completions.create(
                model="ragserve", messages=[{"role": "user", "content": "What is a bloom filter?"}]
            )
    finally:
        door.generator.delay_s = 0.0
    assert late.value.status_code == 504 and late.value.body["type"] == "timeout"


def test_a_client_gone_mid_stream_cancels_the_engine_request(door: Door) -> None:
    door.generator.delay_s = 0.5
    cancelled = door.generator.cancelled
    try:
        stream = door.client().chat.completions.create(
            model="ragserve", stream=True, messages=[{"role": "user", "content": "What is the CAP theorem?"}]
        )
        next(iter(stream))  # the passages' chunk: the engine is answering
        stream.close()
        give_up = asyncio.run(_wait_for(lambda: door.generator.cancelled > cancelled, 10.0))
    finally:
        door.generator.delay_s = 0.0
    assert give_up, "the fake engine's stream was not cancelled after the client left"


async def _wait_for(condition: Any, limit_s: float) -> bool:
    for _ in range(int(limit_s / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_tls_with_client_certificates_names_the_caller(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, clients=("billing", "stranger"))
    settings = Settings(
        http={"port": free_port()},
        access={
            "tls_cert_file": str(pki.server_cert),
            "tls_key_file": str(pki.server_key),
            "tls_client_ca_file": str(pki.ca_cert),
            "tls_allowed_client_ids": "billing",
        },
    )
    app = openai_app(settings, make_front(settings))  # no pipeline yet: still loading
    url = f"https://localhost:{settings.http.port}/v1"

    def curl(client: str, *args: str) -> tuple[int, dict[str, Any]]:
        cert, key = pki.clients[client]
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "--cacert",
                str(pki.ca_cert),
                "--cert",
                str(cert),
                "--key",
                str(key),
                "-w",
                "\n%{http_code}",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        body, _, status = out.rpartition("\n")
        return int(status), json.loads(body)

    with serving(settings, app):
        assert curl("billing", f"{url}/models")[0] == 200
        status, body = curl("stranger", f"{url}/models")
        assert status == 403 and body["error"]["type"] == "permission_error"
        ask = '{"messages": [{"role": "user", "content": "q"}]}'
        status, body = curl("billing", f"{url}/chat/completions", "-H", JSON, "-d", ask)
        assert status == 503 and "loading" in body["error"]["message"]
        plain = subprocess.run(["curl", "-sS", "--cacert", str(pki.ca_cert), f"{url}/models"], capture_output=True)
        assert plain.returncode != 0  # no client certificate: no TLS session at all


def test_the_request_class_comes_from_the_header_or_the_body(door: Door) -> None:
    ask = {"model": "ragserve", "messages": [{"role": "user", "content": "What is a Raft leader?"}]}
    client = door.client()
    by_header = client.chat.completions.create(**ask, extra_headers={"x-request-class": "batch"})
    by_body = client.chat.completions.create(**ask, extra_body={"request_class": "batch"})
    plain = client.chat.completions.create(**ask)
    classes = [r.model_extra["ragserve"]["final"]["request_class"] for r in (by_header, by_body, plain)]
    assert classes == ["REQUEST_CLASS_BATCH", "REQUEST_CLASS_BATCH", "REQUEST_CLASS_INTERACTIVE"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ask, extra_headers={"x-request-class": "urgent"})
    assert refused.value.body["param"] == "x-request-class"
