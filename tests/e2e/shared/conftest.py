"""The session's full server and its retrieval-only one, shared by every module in this folder (one
pytest process runs the folder: deploy/local/test.sh)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.servers import LIVE_ENV, LiveServer, SessionServers
from tests.helpers import free_port

# The reader always gets its passage (as on the full server): this server measures the reader's
# cost while the full server's engine starts beside it, so its estimate comes out high.
# The retrieval-only server keeps even the sample's small graph in a helper process, so the path a
# big version takes runs through a real server (test_cli_retrieve.py kills the helper).
RETRIEVAL_ENV = {
    "RAGSERVE_GENERATION_ENABLED": "false",
    "RAGSERVE_READER_BUDGET_MS": "2000",
    "RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS": "0",
}
FIXTURES = {"live_server": "live", "retrieval_server": "retrieval"}


@pytest.fixture(scope="session")
def session_servers(
    sample_index: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SessionServers]:
    """The two start together (their start-ups overlap), on first use of either, each only if this
    run's tests take it."""
    wanted = {server for item in request.session.items for f, server in FIXTURES.items() if f in item.fixturenames}
    # The live server's OpenAI-compatible door on a port of its own (test_openai_door.py), with the
    # MCP door beside it (test_mcp_door.py).
    live_env = {**LIVE_ENV, "RAGSERVE_OPENAI_PORT": str(free_port()), "RAGSERVE_MCP_ENABLED": "true"}
    servers = SessionServers(
        sample_index,
        tmp_path_factory.mktemp("session-servers"),
        {"live": live_env, "retrieval": RETRIEVAL_ENV},
        wanted,
    )
    yield servers
    servers.stop_all()


@pytest.fixture(scope="session")
def live_server(session_servers: SessionServers) -> LiveServer:
    return session_servers.get("live")


@pytest.fixture(scope="session")
def retrieval_server(session_servers: SessionServers) -> LiveServer:
    """Retrieval-only (no generator): starts in seconds; for input, auth and transport tests."""
    return session_servers.get("retrieval")
