"""Domain errors. Each carries a door-neutral kind (`ErrorKind`); every door maps a kind to its own
status in one table (server/grpc/status.py for gRPC, server/http/errors.py for HTTP)."""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """What went wrong, whichever door the call came through. The values are the canonical status
    names (google.rpc.Code), also the status label of `ragserve_requests_total`."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INTERNAL = "INTERNAL"


class RagError(Exception):
    """Base of every error the service reports to a caller on purpose."""

    kind = ErrorKind.INTERNAL


class InvalidArgument(RagError):
    """A request field is out of range or malformed."""

    kind = ErrorKind.INVALID_ARGUMENT

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class Overloaded(RagError):
    """Too many requests in flight; the caller should retry later."""

    kind = ErrorKind.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class DeadlineExpired(RagError):
    """The caller's deadline passed before the work could finish."""

    kind = ErrorKind.DEADLINE_EXCEEDED


class Unavailable(RagError):
    """A required engine is not ready or has died."""

    kind = ErrorKind.UNAVAILABLE


class IndexLoadError(RagError):
    """An index folder is missing, corrupt or does not match the configured models."""

    kind = ErrorKind.UNAVAILABLE


class ConfigError(RagError):
    """A setting names something that cannot be used (a missing model, a bad path)."""

    kind = ErrorKind.FAILED_PRECONDITION


class Unauthenticated(RagError):
    """No credential, or one the server does not know (a wrong key and a revoked one alike)."""

    kind = ErrorKind.UNAUTHENTICATED


class PermissionDenied(RagError):
    """A known caller this server does not let in (a certificate outside the allowed ids)."""

    kind = ErrorKind.PERMISSION_DENIED
