"""The session's float32 server, shared by the modules in this folder (one pytest process runs the
folder: deploy/local/test.sh)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.servers import FLOAT32_ENV, LiveServer, SessionServers


@pytest.fixture(scope="session")
def float32_servers(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionServers]:
    """Started on first use: test_remote.py takes it after starting its vLLM servers, so that their
    start-ups overlap."""
    servers = SessionServers(sample_index, tmp_path_factory.mktemp("float32-server"), {"float32": FLOAT32_ENV})
    yield servers
    servers.stop_all()


@pytest.fixture(scope="session")
def float32_server(float32_servers: SessionServers) -> LiveServer:
    """Greedy answers token-exact across engines (FLOAT32_ENV): test_speculation, test_remote."""
    return float32_servers.get("float32")
