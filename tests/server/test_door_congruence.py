"""Every door, one table: the same cases through gRPC, the OpenAI-compatible HTTP door and the MCP
door (its `answer` tool, through the official MCP client), in process, over the real front,
embedder and index and a generator fake (tests/server/doors.py). Each row's outcome is normalised
(the error's kind, the field it names, the documents the caller saw) and must be the same on every
door. A new door adds its `ask` function here before it lands.

Callers are told apart by named keys (RAGSERVE_API_KEYS_FILE): `alice` is granted the `secret`
group, `bob` nothing (he reads only documents marked public).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from ragserve.api_keys import add_key, revoke_keys
from ragserve.errors import ErrorKind
from ragserve.server.http.errors import STATUS
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.server.doors import MAX_QUERY_CHARS, QUESTION, SECRET_DOC, Doors, call_tool


@dataclass(frozen=True)
class Case:
    """One row: who asks, with which fields (the door-neutral names), and what every door must say."""

    caller: str  # a key's caller name, "" for no credential, "wrong" for an unknown key
    question: str = QUESTION
    fields: dict[str, Any] = field(default_factory=dict)
    turns: tuple[tuple[str, str], ...] = ()
    batch: bool = False


@dataclass(frozen=True)
class Outcome:
    kind: str  # OK or the error's kind (server/grpc/status.py's and server/http/errors.py's tables)
    field: str = ""  # the field an INVALID_ARGUMENT names, in door-neutral words
    docs: frozenset[str] = frozenset()


def _credential(doors: Doors, caller: str) -> str | None:
    if caller == "wrong":
        return "Bearer rsk_not-a-key-this-server-knows"
    return f"Bearer {doors.keys[caller]}" if caller else None


# ---- the doors, each as: case -> normalised outcome ----------------------------------------------

_ROLE = {"user": pb.Turn.ROLE_USER, "assistant": pb.Turn.ROLE_ASSISTANT}


def ask_grpc(doors: Doors, case: Case) -> Outcome:
    fields = dict(case.fields)
    request = pb.QueryRequest(query=case.question, history=[pb.Turn(role=_ROLE[r], text=t) for r, t in case.turns])
    if "filter" in fields:
        json_format.ParseDict(fields.pop("filter"), request.filter)
    for name, value in fields.items():
        setattr(request, name, value)
    request.request_class = pb.REQUEST_CLASS_BATCH if case.batch else pb.REQUEST_CLASS_INTERACTIVE
    credential = _credential(doors, case.caller)
    metadata = [("authorization", credential)] if credential else []
    with grpc.insecure_channel(doors.grpc_target) as channel:
        try:
            events = list(pb_grpc.RagServiceStub(channel).Query(request, metadata=metadata, timeout=30))
        except grpc.RpcError as error:
            return Outcome(error.code().name, _grpc_field(error))
    docs = {p.doc_id for e in events if e.HasField("retrieval") for p in e.retrieval.passages}
    return Outcome("OK", docs=frozenset(docs))


def _grpc_field(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status else ():
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad) and bad.field_violations:
            return _neutral(bad.field_violations[0].field)
    return ""


def ask_http(doors: Doors, case: Case) -> Outcome:
    messages = [{"role": r, "content": t} for r, t in case.turns] + [{"role": "user", "content": case.question}]
    body = {"model": "ragserve", "messages": messages, **case.fields}
    if case.batch:
        body["request_class"] = "batch"
    credential = _credential(doors, case.caller)
    headers = {"authorization": credential} if credential else {}
    reply = httpx.post(f"{doors.http_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    payload = reply.json()
    if reply.status_code != 200:
        error = payload["error"]
        kind = error["code"].upper()
        assert STATUS[ErrorKind(kind)] == (reply.status_code, error["type"])  # the door's one table
        return Outcome(kind, _neutral(error.get("param") or ""))
    passages = payload["ragserve"].get("retrieval", {}).get("passages", [])
    return Outcome("OK", docs=frozenset(p["doc_id"] for p in passages))


def ask_mcp(doors: Doors, case: Case) -> Outcome | None:
    """The `answer` tool through the official MCP client; None for a row whose fields the tool does
    not take (its answers use the server's defaults)."""
    if set(case.fields) - {"filter"}:
        return None
    arguments: dict[str, Any] = {"question": case.question, **case.fields}
    if case.turns:
        arguments["history"] = [{"role": r, "text": t} for r, t in case.turns]
    if case.batch:
        arguments["request_class"] = "batch"
    credential = _credential(doors, case.caller)
    headers = {"authorization": credential} if credential else {}
    # The door refuses a credential before the protocol starts (401), where the SDK's client only
    # says "an error response": asked plainly first.
    if httpx.post(f"{doors.http_url}/mcp", json={}, headers=headers, timeout=30).status_code == 401:
        return Outcome("UNAUTHENTICATED")
    result = asyncio.run(call_tool(doors.http_url, credential, "answer", arguments))
    if result.is_error:
        message = result.content[0].text.split(": ", 1)[1]  # "Error executing tool answer: KIND: field: ..."
        kind, _, rest = message.partition(": ")
        field = rest.split(":", 1)[0] if kind == "INVALID_ARGUMENT" else ""
        return Outcome(kind, _neutral(field))
    passages = (result.structured_content or {}).get("passages", [])
    return Outcome("OK", docs=frozenset(p["doc_id"] for p in passages))


def _neutral(wire_field: str) -> str:
    """A field as the table names it, the top-level name of gRPC's field: on the HTTP door the
    question is the last message's `content`, and the turns are the messages before it."""
    if wire_field.startswith("messages"):
        return "query" if wire_field.endswith(".content") else "history"
    top = wire_field.split("[")[0].split(".")[0]
    return "query" if top == "question" else top  # MCP's `answer` names it `question`


DOORS: dict[str, Callable[[Doors, Case], Outcome | None]] = {"grpc": ask_grpc, "http": ask_http, "mcp": ask_mcp}

# ---- the table -----------------------------------------------------------------------------------

PUBLIC = frozenset({"zephyr-public.md", "tides.md"})

CASES: dict[str, tuple[Case, Callable[[Outcome], bool]]] = {
    "no credential": (Case(""), lambda o: o.kind == "UNAUTHENTICATED"),
    "an unknown key": (Case("wrong"), lambda o: o.kind == "UNAUTHENTICATED"),
    "a granted caller reads the secret": (Case("alice"), lambda o: o.kind == "OK" and SECRET_DOC in o.docs),
    "an ungranted caller does not": (Case("bob"), lambda o: o.kind == "OK" and bool(o.docs) and o.docs <= PUBLIC),
    "a widening should": (
        Case("bob", fields={"filter": {"should": [{"key": "groups", "match": {"value": "secret"}}]}}),
        lambda o: o.kind == "OK" and SECRET_DOC not in o.docs,
    ),
    "a filter narrows": (
        Case("alice", fields={"filter": {"must": [{"key": "groups", "match": {"value": "public"}}]}}),
        lambda o: o.kind == "OK" and bool(o.docs) and o.docs <= PUBLIC,
    ),
    "a filter on an unknown field": (
        Case("alice", fields={"filter": {"must": [{"key": "colour", "match": {"value": "red"}}]}}),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "filter",
    ),
    "top_k over the cap": (
        Case("alice", fields={"top_k": 100_000}),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "top_k",
    ),
    "a question too long": (
        Case("alice", question="zephyr " * MAX_QUERY_CHARS),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "query",
    ),
    "an empty question": (Case("alice", question="   "), lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "query"),
    "max_tokens over the cap": (
        Case("alice", fields={"max_tokens": 10**6}),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "max_tokens",
    ),
    "temperature out of range": (
        Case("alice", fields={"temperature": 3.0}),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "temperature",
    ),
    "a history within bounds": (
        Case(
            "alice",
            question="And its code?",
            turns=(("user", "Tell me about Project Zephyr."), ("assistant", "A balloon [1].")),
        ),
        lambda o: o.kind == "OK" and SECRET_DOC in o.docs,
    ),
    "a history over its turns": (
        Case("alice", turns=(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"))),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "history",
    ),
    "a history turn too long": (
        Case("alice", turns=(("user", "x" * 500),)),
        lambda o: o.kind == "INVALID_ARGUMENT" and o.field == "history",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_door_gives_the_same_outcome(doors: Doors, name: str) -> None:
    case, expected = CASES[name]
    asked = {door: ask(doors, case) for door, ask in DOORS.items()}
    outcomes = {door: outcome for door, outcome in asked.items() if outcome is not None}
    assert {"grpc", "http"} <= set(outcomes)
    for door, outcome in outcomes.items():
        assert expected(outcome), f"{door}: {outcome}"
    first = next(iter(outcomes.values()))
    assert all(o.kind == first.kind and o.field == first.field for o in outcomes.values()), outcomes


def test_a_new_key_works_and_a_revoked_one_stops_on_every_door_without_a_restart(doors: Doors) -> None:
    doors.keys["carol"] = add_key(doors.key_file, "carol")  # a caller of this test's own
    _wait_for(lambda: all(ask(doors, Case("carol")).kind == "OK" for ask in DOORS.values()))
    revoke_keys(doors.key_file, "carol")
    _wait_for(lambda: all(ask(doors, Case("carol")).kind == "UNAUTHENTICATED" for ask in DOORS.values()))


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    ends = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < ends, "not within the time a key file change takes"
        time.sleep(0.3)


# ---- rows that need a call in flight (an answer that takes 10 s, calls cut at 2): the slow suite --


@contextlib.contextmanager
def _holding(doors: Doors, case: Case) -> Iterator[None]:
    """`case` asked through gRPC in a thread of its own, held in flight (until the call's 2 s end)."""
    before = doors.front.gate.in_flight
    holder = threading.Thread(target=ask_grpc, args=(doors, case), daemon=True)
    holder.start()
    _wait_for(lambda: doors.front.gate.in_flight > before)
    try:
        yield
    finally:
        holder.join(10)


@pytest.mark.slow
@pytest.mark.parametrize("door", list(DOORS))
def test_past_the_calls_end_every_door_says_deadline_exceeded(slow_doors: Doors, door: str) -> None:
    assert DOORS[door](slow_doors, Case("alice")).kind == "DEADLINE_EXCEEDED"


@pytest.mark.slow
@pytest.mark.parametrize("door", list(DOORS))
def test_a_second_batch_call_is_shed_while_a_person_still_gets_in(slow_doors: Doors, door: str) -> None:
    with _holding(slow_doors, Case("alice", batch=True)):
        assert DOORS[door](slow_doors, Case("alice", batch=True)).kind == "RESOURCE_EXHAUSTED"
        assert DOORS[door](slow_doors, Case("alice")).kind == "DEADLINE_EXCEEDED"  # admitted, then cut at 2 s


@pytest.mark.slow
@pytest.mark.parametrize("door", list(DOORS))
def test_a_caller_past_its_own_limit_is_shed_by_its_key_name(slow_doors: Doors, door: str) -> None:
    with _holding(slow_doors, Case("bob")):
        assert DOORS[door](slow_doors, Case("bob")).kind == "RESOURCE_EXHAUSTED"


def _leave_grpc(doors: Doors) -> None:
    with grpc.insecure_channel(doors.grpc_target) as channel:
        metadata = [("authorization", f"Bearer {doors.keys['alice']}")]
        events = pb_grpc.RagServiceStub(channel).Query(pb.QueryRequest(query=QUESTION), metadata=metadata, timeout=30)
        next(events)
        next(events)  # the retrieval event, then a token: the engine is answering
        events.cancel()


def _leave_http(doors: Doors) -> None:
    body = {"model": "ragserve", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}
    headers = {"authorization": f"Bearer {doors.keys['alice']}"}
    with httpx.stream("POST", f"{doors.http_url}/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        lines = r.iter_lines()
        while '"content":"word ' not in next(lines):  # a token: the engine is answering
            pass


def _leave_mcp(doors: Doors) -> None:
    async def leave() -> None:
        answering = asyncio.Event()

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            answering.set()  # passages found: the engine is answering

        credential = f"Bearer {doors.keys['alice']}"
        call = asyncio.create_task(call_tool(doors.http_url, credential, "answer", {"question": QUESTION}, on_progress))
        await asyncio.wait_for(answering.wait(), 20)
        call.cancel()  # the client closes its connection
        with contextlib.suppress(BaseException):
            await call

    asyncio.run(leave())


@pytest.mark.slow
@pytest.mark.parametrize("leave", [_leave_grpc, _leave_http, _leave_mcp], ids=list(DOORS))
def test_a_client_that_leaves_stops_the_engine_on_every_door(slow_doors: Doors, leave: Callable[[Doors], None]) -> None:
    before = slow_doors.generator.cancelled
    leave(slow_doors)
    _wait_for(lambda: slow_doors.generator.cancelled == before + 1)
    _wait_for(lambda: slow_doors.front.gate.in_flight == 0)


def test_two_hundred_trickling_http_connections_do_not_stop_grpc(doors: Doors) -> None:
    """Round six: slow HTTP clients (a header trickled, never finished) hold at most the door's
    connection cap; a gRPC Query beside them is answered."""
    import socket

    port = int(doors.http_url.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(sock)
        assert ask_grpc(doors, Case("alice")).kind == "OK"
    finally:
        for sock in held:
            sock.close()
