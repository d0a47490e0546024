"""The door-neutral front: its outcome for whatever a call raises, and the doors' error tables."""

from __future__ import annotations

import asyncio

import pytest

from ragserve.config import Settings
from ragserve.errors import ErrorKind, InvalidArgument, RagError
from ragserve.server.app import make_front
from ragserve.server.gate import SERVICE_NAME
from ragserve.server.openai_wire import STATUS
from ragserve.server.status import CODES
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
