"""Every door, one table: the same cases through gRPC and the OpenAI-compatible HTTP door, in
process, over the real front, embedder and index and a generator fake (named as such). Each row's
outcome is normalised (the error's kind, the field it names, the documents the caller saw) and
must be the same on every door. A new door adds its `ask` function here before it lands.

Callers are told apart by named keys (RAGSERVE_API_KEYS_FILE): `alice` is granted the `secret`
group, `bob` nothing (he reads only documents marked public).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from indexer.build import build_index
from ragserve.api_keys import add_key, revoke_keys
from ragserve.config import Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import ErrorKind
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.server.app import build_grpc_server, make_front
from ragserve.server.http_listener import HttpListener
from ragserve.server.openai_http import OpenAIDoor
from ragserve.server.openai_wire import STATUS
from ragserve.server.servicer import RagServicer
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.fakes import FakeGenerator
from tests.helpers import free_port

DOCS = {
    "zephyr-launch.md": ("secret", "Project Zephyr launch code\nThe launch code of Project Zephyr is 4417."),
    "zephyr-public.md": ("public", "Project Zephyr\nProject Zephyr is a weather balloon programme from Kiruna."),
    "tides.md": ("public", "Tides\nOcean tides are caused mainly by the gravitational pull of the moon."),
}
SECRET_DOC = "zephyr-launch.md"
QUESTION = "What is the launch code of Project Zephyr?"
MAX_QUERY_CHARS = 300


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
    kind: str  # OK or the error's kind (server/status.py's and openai_wire.py's tables)
    field: str = ""  # the field an INVALID_ARGUMENT names, in door-neutral words
    docs: frozenset[str] = frozenset()


@dataclass
class Doors:
    grpc_target: str
    http_url: str
    keys: dict[str, str]
    key_file: Path
    front: Any
    generator: FakeGenerator


@pytest.fixture(scope="module")
def access_index(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    work = tmp_path_factory.mktemp("doors")
    (work / "docs").mkdir()
    for name, (group, text) in DOCS.items():
        (work / "docs" / name).write_text(f"---\ngroups: [{group}]\n---\n# {text}")
    build_index(work / "docs", work / "idx", embedder, progress=False)
    return work / "idx"


@contextlib.contextmanager
def _doors(
    index: Path, embedder: SentenceTransformerEmbedder, key_file: Path, generator: FakeGenerator, **limits: Any
) -> Iterator[Doors]:
    keys = {name: add_key(key_file, name) for name in ("alice", "bob")}
    settings = Settings(
        transport={"port": free_port()},
        openai={"port": free_port()},
        access={"api_keys_file": str(key_file)},
        grants={"field": "groups", "grants": json.dumps({"alice": ["secret"]})},
        requests={"max_query_chars": MAX_QUERY_CHARS},
        history={"max_history_turns": 2, "max_turn_chars": 200},
        limits={"max_call_s": 5.0, **limits},
    )
    executor = ThreadPoolExecutor(2)
    front = make_front(settings, assemble_pipeline(embedder, HnswIndex.load(index), generator, executor))
    with _serving(settings, front):
        grpc_target, http_url = f"127.0.0.1:{settings.transport.port}", f"http://127.0.0.1:{settings.openai.port}"
        yield Doors(grpc_target, http_url, keys, key_file, front, generator)
    executor.shutdown()


@pytest.fixture(scope="module")
def doors(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[Doors]:
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    with _doors(access_index, embedder, key_file, FakeGenerator(words=["It ", "is ", "[1]."])) as both:
        yield both


@pytest.fixture(scope="module")
def slow_doors(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[Doors]:
    """An answer that takes 10 s, a call that may take 2, one batch slot of three, bob one call."""
    key_file = tmp_path_factory.mktemp("slow-keys") / "keys"
    slow = FakeGenerator(words=["word "] * 40, delay_s=0.25)
    limits = {"max_call_s": 2.0, "max_in_flight": 3, "interactive_reserved": 2, "caller_limits": "bob=interactive:1"}
    with _doors(access_index, embedder, key_file, slow, **limits) as both:
        yield both


@contextlib.contextmanager
def _serving(settings: Settings, front: Any) -> Iterator[None]:
    """Both doors over one front, on one event loop in a thread, as the server runs them."""
    started, box = threading.Event(), []

    async def main() -> None:
        stop = asyncio.Event()
        box.extend([asyncio.get_running_loop(), stop])
        server, _ = build_grpc_server(settings, RagServicer(front))
        server.add_insecure_port(f"127.0.0.1:{settings.transport.port}")
        await server.start()
        http = HttpListener(OpenAIDoor(settings, front).app, "127.0.0.1", settings.openai.port, settings)
        await http.start()
        started.set()
        await stop.wait()
        await http.close()
        await server.stop(None)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert started.wait(30), "the doors did not start"
    try:
        yield
    finally:
        box[0].call_soon_threadsafe(box[1].set)
        thread.join(30)


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


def _neutral(wire_field: str) -> str:
    """A field as the table names it, the top-level name of gRPC's field: on the HTTP door the
    question is the last message's `content`, and the turns are the messages before it."""
    if wire_field.startswith("messages"):
        return "query" if wire_field.endswith(".content") else "history"
    return wire_field.split("[")[0].split(".")[0]


DOORS: dict[str, Callable[[Doors, Case], Outcome]] = {"grpc": ask_grpc, "http": ask_http}

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
    outcomes = {door: ask(doors, case) for door, ask in DOORS.items()}
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


@pytest.mark.slow
@pytest.mark.parametrize("leave", [_leave_grpc, _leave_http], ids=list(DOORS))
def test_a_client_that_leaves_stops_the_engine_on_every_door(slow_doors: Doors, leave: Callable[[Doors], None]) -> None:
    before = slow_doors.generator.cancelled
    leave(slow_doors)
    _wait_for(lambda: slow_doors.generator.cancelled == before + 1)
    _wait_for(lambda: slow_doors.front.gate.in_flight == 0)
