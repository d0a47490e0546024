"""The HTTP listener's one app: every HTTP door's routes side by side, each door without the others,
and the listener's settings under their names (RAGSERVE_HTTP_*) and their former ones."""

from __future__ import annotations

import asyncio

import pytest

from ragserve.config import FORMER_NAMES, Settings
from ragserve.server.app import RagServer
from tests.helpers import free_port


def _paths(settings: Settings) -> set[str]:
    """The paths a server with these settings puts on its listener (built on a loop, as it runs)."""

    async def build() -> set[str]:
        return {getattr(route, "path", "") for route in RagServer(settings)._http_routes}

    return asyncio.run(build())


def test_the_mcp_door_runs_without_the_openai_door() -> None:
    alone = Settings(http={"port": free_port()}, mcp={"enabled": True}, openai={"enabled": False})
    assert _paths(alone) == {"/mcp"}
    both = Settings(http={"port": free_port()}, mcp={"enabled": True})
    assert _paths(both) == {"/mcp", "/v1/chat/completions", "/v1/models"}
    assert _paths(Settings()) == set()  # no port: no listener


def test_the_listeners_settings_are_read_under_their_names_and_their_former_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGSERVE_OPENAI_PORT", "8000")
    monkeypatch.setenv("RAGSERVE_OPENAI_MAX_CONNECTIONS", "7")
    assert (Settings().http.port, Settings().http.max_connections) == (8000, 7)
    monkeypatch.setenv("RAGSERVE_HTTP_PORT", "8100")  # the new name wins
    assert Settings().http.port == 8100
    assert FORMER_NAMES["RAGSERVE_OPENAI_PORT"] == "RAGSERVE_HTTP_PORT"
    assert "RAGSERVE_OPENAI_MODEL_NAME" not in FORMER_NAMES  # the door's own stays the door's
