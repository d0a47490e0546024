"""Domain errors. The server maps each kind to one gRPC status in one place."""

from __future__ import annotations


class RagError(Exception):
    """Base of every error the service reports to a caller on purpose."""


class InvalidArgument(RagError):
    """A request field is out of range or malformed."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


class Overloaded(RagError):
    """Too many requests in flight; the caller should retry later."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class DeadlineExpired(RagError):
    """The caller's deadline passed before the work could finish."""


class Unavailable(RagError):
    """A required engine is not ready or has died."""


class IndexLoadError(RagError):
    """An index folder is missing, corrupt or does not match the configured models."""


class ConfigError(RagError):
    """A setting names something that cannot be used (a missing model, a bad path)."""
