"""Fixtures: the shared end-to-end servers (helpers in tests/e2e/servers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.servers import LIVE_ENV, LiveServer, serving


@pytest.fixture(scope="session")
def live_server(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serving(sample_index, tmp_path_factory.mktemp("server") / "server.log", LIVE_ENV)


@pytest.fixture(scope="session")
def retrieval_server(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Retrieval-only (no generator): starts in seconds; for input, auth and transport tests."""
    log = tmp_path_factory.mktemp("retrieval-server") / "server.log"
    yield from serving(sample_index, log, {"RAGSERVE_GENERATION_ENABLED": "false"})
