"""The one place that maps domain errors to gRPC status codes and rich error details."""

from __future__ import annotations

import collections

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragserve.errors import (
    ConfigError,
    DeadlineExpired,
    IndexLoadError,
    InvalidArgument,
    Overloaded,
    RagError,
    Unavailable,
)

_CODES: list[tuple[type[RagError], int]] = [
    (InvalidArgument, code_pb2.INVALID_ARGUMENT),
    (Overloaded, code_pb2.RESOURCE_EXHAUSTED),
    (DeadlineExpired, code_pb2.DEADLINE_EXCEEDED),
    (Unavailable, code_pb2.UNAVAILABLE),
    (IndexLoadError, code_pb2.UNAVAILABLE),
    (ConfigError, code_pb2.FAILED_PRECONDITION),
]


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):  # type: ignore[misc]
    pass


def to_status(error: RagError) -> grpc.Status:
    code = next((c for kind, c in _CODES if isinstance(error, kind)), code_pb2.INTERNAL)
    status = status_pb2.Status(code=code, message=str(error))
    if isinstance(error, InvalidArgument):
        detail = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=error.field, description=error.description)
            ]
        )
        status.details.add().Pack(detail)
    elif isinstance(error, Overloaded):
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=error.retry_after_ms * 1_000_000))
        status.details.add().Pack(retry)
        base = rpc_status.to_status(status)
        # The standard pushback trailer, read by gRPC's own retry machinery.
        pushback = (("grpc-retry-pushback-ms", str(error.retry_after_ms)),)
        return _Status(base.code, base.details, tuple(base.trailing_metadata) + pushback)
    return rpc_status.to_status(status)
