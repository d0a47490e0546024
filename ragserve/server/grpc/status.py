"""The gRPC door's one table: an error kind to its status code, with rich error details."""

from __future__ import annotations

import collections

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragserve.errors import ErrorKind, InvalidArgument, Overloaded, RagError

# The kinds are named after the canonical codes: each maps to the code of its own name.
CODES: dict[ErrorKind, int] = {kind: code_pb2.Code.Value(kind.value) for kind in ErrorKind}


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):  # type: ignore[misc]
    pass


def to_status(error: RagError) -> grpc.Status:
    code = CODES[error.kind]
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
