"""The door-neutral front: its outcome for whatever a call raises, and the doors' error tables."""

from __future__ import annotations

import asyncio

import pytest

from ragserve.config import Settings
from ragserve.errors import ErrorKind, InvalidArgument, RagError
from ragserve.server.app import make_front
from ragserve.server.gate import SERVICE_NAME
from ragserve.server.grpc.status import CODES
from ragserve.server.http.errors import STATUS
from ragserve.v1 import rag_pb2 as pb


def test_the_spans_name_the_protos_service() -> None:
    assert pb.DESCRIPTOR.services_by_name["RagService"].full_name == SERVICE_NAME


def test_every_kind_has_a_status_on_every_door() -> None:
    assert set(CODES) == set(STATUS) == set(ErrorKind)


def _outcome(raised: BaseException) -> list[RagError]:
    front, failures = make_front(Settings()), []

    async def fail(error: RagError) -> None:
        failures.append(error)

    async def run() -> None:
        async with front.outcome("Retrieve", "req-1", fail):
            raise raised

    asyncio.run(run())
    return failures


def test_a_domain_error_reaches_the_door_as_it_is() -> None:
    error = InvalidArgument("top_k", "too big")
    assert _outcome(error) == [error]


def test_a_crash_reaches_the_door_as_internal_with_the_request_id_only(caplog: pytest.LogCaptureFixture) -> None:
    (failure,) = _outcome(KeyError("/srv/secret/path"))
    assert failure.kind is ErrorKind.INTERNAL
    assert str(failure) == "internal error (request id req-1)"
    assert "/srv/secret/path" in caplog.text  # the traceback stays in the server's log


def test_a_question_error_names_the_doors_own_field() -> None:
    from ragserve.server.front import Ask

    front = make_front(Settings())
    with pytest.raises(InvalidArgument) as refused:
        front.retrieve_params(Ask("  ", question_field="messages[2].content"), set())
    assert refused.value.field == "messages[2].content"


def test_an_index_error_reaches_the_caller_without_the_servers_paths(caplog: pytest.LogCaptureFixture) -> None:
    from ragserve.errors import IndexLoadError

    (failure,) = _outcome(IndexLoadError("/srv/index/v000003/docstore.jsonl:17: bad docstore record"))
    assert failure.kind is ErrorKind.UNAVAILABLE
    assert "/srv" not in str(failure) and "req-1" in str(failure)
    assert "/srv/index/v000003/docstore.jsonl:17" in caplog.text


class FakeInfoPipeline:
    """Answers Info only: a corpus of 40 chunks, warming 9 of 12 planned passages."""

    async def info_for(self, grant: object) -> object:
        from ragserve.reports import PipelineInfo, WarmState

        chunks = 40 if grant is None else 4
        return PipelineInfo("v1", chunks, "model", (), warming=WarmState("v1", passages=9, planned=12, left_out=3))


def test_a_caller_whose_grant_reads_less_gets_no_whole_corpus_warming_counts() -> None:
    import json

    settings = Settings(grants={"field": "groups", "grants": json.dumps({"admin": ["*"], "bob": ["team"]})})
    front = make_front(settings, FakeInfoPipeline())  # type: ignore[arg-type]
    bob, _ = asyncio.run(front.info({"bob"}))
    admin, _ = asyncio.run(front.info({"admin"}))
    assert bob.index_chunks == 4 and (bob.warming.passages, bob.warming.planned, bob.warming.left_out) == (0, 0, 0)
    assert admin.index_chunks == 40 and admin.warming.passages == 9 and admin.warming.planned == 12
