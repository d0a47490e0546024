"""A version whose documents were embedded by another backend than the server's questions serves,
with a warning naming both and the build flag that matches."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from ragserve.factory.versions import warn_if_backend_differs


def _warns(own: str, recorded: str, caplog: pytest.LogCaptureFixture) -> bool:
    embedder: Any = SimpleNamespace(backend=own)
    manifest: Any = SimpleNamespace(embedder_backend=recorded)
    with caplog.at_level(logging.WARNING, logger="ragserve.factory.versions"):
        return warn_if_backend_differs(embedder, manifest, "v000003")


def test_the_same_backend_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    assert not _warns("onnx-int8", "onnx-int8", caplog)
    assert not _warns("onnx-int8", "", caplog)  # a version older than the field: nothing to compare
    assert not caplog.records


def test_another_backend_is_named(caplog: pytest.LogCaptureFixture) -> None:
    assert _warns("onnx-int8", "torch", caplog)
    (record,) = caplog.records
    line = record.getMessage()
    assert "v000003" in line and "embedded with torch" in line and "--backend onnx`" in line
    caplog.clear()
    assert _warns("onnx", "onnx-int8", caplog)
    assert "--backend onnx --no-int8" in caplog.records[0].getMessage()
