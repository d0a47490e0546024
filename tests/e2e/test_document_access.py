"""Document access end to end: two mTLS callers, one shared answer cache, a warmed engine.

Alice's certificate is granted the `secret` group; Bob's is granted nothing, so he reads only
documents marked public. Each question is asked in both orders (Bob first, then Alice first): no
passage, highlight, reader span, cached answer or count of a secret document may reach Bob.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from indexer.build import build_index
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.certs import Pki, make_pki
from tests.e2e.servers import LiveServer, serving, wait_warm

SECRET_CODE = "4417"
DOCS = {
    "zephyr-launch.md": ("secret", f"Project Zephyr launch code\nThe launch code of Project Zephyr is {SECRET_CODE}."),
    "zephyr-public.md": ("public", "Project Zephyr\nProject Zephyr is a weather balloon programme flying from Kiruna."),
    "tides.md": ("public", "Tides\nOcean tides are caused mainly by the gravitational pull of the moon."),
    "payroll.md": ("hr", "Payroll\nThe payroll run happens on the 25th day of every month."),
}
QUESTIONS = ["What is the launch code of Project Zephyr?", "Which code launches Project Zephyr?"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("alice app", "bob app"))


@pytest.fixture(scope="module")
def access_index(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    docs = tmp_path_factory.mktemp("access-docs")
    for name, (group, text) in DOCS.items():
        (docs / name).write_text(f"---\ngroups: [{group}]\n---\n# {text}")
    root = tmp_path_factory.mktemp("access-index") / "idx"
    build_index(docs, root, embedder, progress=False)
    return root


@pytest.fixture(scope="module")
def server(access_index: Path, tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LiveServer]:
    env = {
        "RAGSERVE_TLS_CERT_FILE": str(pki.server_cert),
        "RAGSERVE_TLS_KEY_FILE": str(pki.server_key),
        "RAGSERVE_TLS_CLIENT_CA_FILE": str(pki.ca_cert),
        "RAGSERVE_ACCESS_FIELD": "groups",
        "RAGSERVE_ACCESS_GRANTS": json.dumps({"alice app": ["secret"]}),
        "RAGSERVE_WARM_WHOLE_CORPUS": "true",  # the secret passage is in the engine's KV cache too
        "RAGSERVE_READER_BUDGET_MS": "2000",
    }
    log = tmp_path_factory.mktemp("access-server") / "server.log"
    for live in serving(access_index, log, env, credentials=_credentials(pki, "alice app")):
        wait_warm(live.target, credentials=_credentials(pki, "alice app"))
        yield live


def _credentials(pki: Pki, name: str) -> grpc.ChannelCredentials:
    cert, key = pki.clients[name]
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(), private_key=key.read_bytes(), certificate_chain=cert.read_bytes()
    )


def _stub(server: LiveServer, pki: Pki, name: str) -> tuple[grpc.Channel, pb_grpc.RagServiceStub]:
    options = [("grpc.ssl_target_name_override", "localhost")]
    channel = grpc.secure_channel(server.target, _credentials(pki, name), options=options)
    return channel, pb_grpc.RagServiceStub(channel)


def _ask(stub: pb_grpc.RagServiceStub, question: str) -> tuple[list[pb.Passage], str, str]:
    """Passages, answer text and every other string the caller was sent (highlights, reader spans)."""
    passages: list[pb.Passage] = []
    text, seen = [], []
    for event in stub.Query(pb.QueryRequest(query=question, max_tokens=24, temperature=0.0), timeout=120):
        kind = event.WhichOneof("event")
        if kind == "retrieval":
            passages = list(event.retrieval.passages)
        elif kind == "token":
            text.append(event.token.text)
        seen.extend(_strings(event))
    return passages, "".join(text), "\n".join(seen)


def _strings(message: Any) -> list[str]:
    """Every string field in a message, nested ones included: what a caller can read (the numbers,
    timings among them, are left out so that digits in a timing never look like the secret)."""
    out: list[str] = []
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if isinstance(item, str):
                out.append(item)
            elif hasattr(item, "ListFields"):
                out.extend(_strings(item))
    return out


@pytest.mark.parametrize("bob_first", [True, False], ids=["bob-first", "alice-first"])
def test_a_caller_never_receives_a_document_outside_its_grant(server: LiveServer, pki: Pki, bob_first: bool) -> None:
    question = QUESTIONS[0 if bob_first else 1]
    alice_channel, alice = _stub(server, pki, "alice app")
    bob_channel, bob = _stub(server, pki, "bob app")
    with alice_channel, bob_channel:
        order = [("bob", bob), ("alice", alice)] if bob_first else [("alice", alice), ("bob", bob)]
        seen = {name: _ask(stub, question) for name, stub in order}
        seen |= {f"{name} again": _ask(stub, question) for name, stub in order}  # now from the answer cache
        for name in ("bob", "bob again"):
            passages, answer, everything = seen[name]
            assert passages, "Bob still gets the public passages"
            assert {p.doc_id for p in passages} <= {"zephyr-public.md", "tides.md"}
            assert SECRET_CODE not in answer and SECRET_CODE not in everything
        assert "zephyr-launch.md" in {p.doc_id for p in seen["alice"][0]}
        retrieved = bob.Retrieve(pb.RetrieveRequest(query=question, top_k=10, answer_span=True), timeout=30)
        readable = "\n".join(_strings(retrieved))
        assert SECRET_CODE not in readable and "payroll" not in readable.lower()
        # Bob's own filter cannot widen his grant.
        widen = pb.Filter(should=[pb.Condition(key="groups", match=pb.Match(value=_string("secret")))])
        assert not bob.Retrieve(pb.RetrieveRequest(query=question, filter=widen), timeout=30).passages
        # Info counts only what each caller may read.
        alice_count = alice.Info(pb.InfoRequest(), timeout=10).index_chunks
        bob_count = bob.Info(pb.InfoRequest(), timeout=10).index_chunks
        assert bob_count < alice_count


def test_a_filter_on_an_unknown_field_is_invalid_argument_naming_it(server: LiveServer, pki: Pki) -> None:
    channel, alice = _stub(server, pki, "alice app")
    with channel:
        bad = pb.Filter(must=[pb.Condition(key="colour", match=pb.Match(value=_string("red")))])
        with pytest.raises(grpc.RpcError) as caught:
            alice.Retrieve(pb.RetrieveRequest(query="tides", filter=bad), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "filter.must[0].key" in (caught.value.details() or "")


def _string(text: str):
    from google.protobuf import struct_pb2

    return struct_pb2.Value(string_value=text)
