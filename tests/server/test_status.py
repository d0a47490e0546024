from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from ragserve.errors import DeadlineExpired, InvalidArgument, Overloaded, Unavailable
from ragserve.server.grpc.status import to_status


def _details(status: grpc.Status) -> status_pb2.Status:
    raw = dict(status.trailing_metadata)["grpc-status-details-bin"]
    return status_pb2.Status.FromString(raw)


def test_invalid_argument_carries_a_field_violation() -> None:
    status = to_status(InvalidArgument("top_k", "must be positive"))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    bad = error_details_pb2.BadRequest()
    assert _details(status).details[0].Unpack(bad)
    assert bad.field_violations[0].field == "top_k"


def test_overload_has_retry_pushback() -> None:
    status = to_status(Overloaded("busy", retry_after_ms=250))
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(status.trailing_metadata)["grpc-retry-pushback-ms"] == "250"


def test_other_kinds() -> None:
    assert to_status(DeadlineExpired("late")).code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert to_status(Unavailable("dead")).code == grpc.StatusCode.UNAVAILABLE
