"""The MCP door of a real server (the real engine), through the official MCP client over
streamable HTTP: the tools listed, search with a filter, an answer whose citations resolve to the
passages gRPC's Query shows for the same question, fetch, fields, and errors. Keys and grants
through this door are in tests/server/test_mcp_door.py and test_door_congruence.py (in process)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ragserve.client import RagClient
from tests.e2e.servers import LiveServer
from tests.server.doors import call_tool

pytestmark = pytest.mark.e2e

QUESTION = "Which mould did Alexander Fleming find killing the bacteria on his plates?"


def _mcp_url(server: LiveServer) -> str:
    return f"http://127.0.0.1:{server.env['RAGSERVE_OPENAI_PORT']}"


def _call(server: LiveServer, tool: str, arguments: dict[str, Any]) -> Any:
    return asyncio.run(call_tool(_mcp_url(server), None, tool, arguments))


def test_search_fetch_and_fields_through_the_official_client(live_server: LiveServer) -> None:
    found = _call(live_server, "search", {"query": "honey bees communicate", "top_k": 3})
    assert not found.is_error
    top = found.structured_content["passages"][0]
    assert "bee" in top["doc_id"] and top["highlight"] and top["highlight"] in top["text"]
    fields = _call(live_server, "fields", {}).structured_content["fields"]
    assert fields["file_type"] == "keyword"
    narrowed = {"must": [{"key": "file_type", "match": {"value": "txt"}}]}
    filtered = _call(live_server, "search", {"query": "honey bees communicate", "filter": narrowed})
    assert all(p["doc_id"].endswith(".txt") for p in filtered.structured_content["passages"])
    fetched = _call(live_server, "fetch", {"chunk_id": top["chunk_id"]}).structured_content
    assert fetched["found"] and fetched["chunks"][0]["text"] == top["text"]


def test_answer_matches_grpc_and_resolves_its_citations(live_server: LiveServer) -> None:
    async def grpc_passages() -> list[str]:
        async with RagClient(live_server.target, default_timeout_s=120) as client:
            events = [e async for e in client.query(QUESTION, temperature=0.0)]
        return [p.chunk_id for p in events[0].retrieval.passages]

    answer = _call(live_server, "answer", {"question": QUESTION})
    assert not answer.is_error, answer.content
    content = answer.structured_content
    assert content["answer"] and content["passages"]
    assert [p["chunk_id"] for p in content["passages"]] == asyncio.run(grpc_passages())
    for citation in content["citations"]:
        cited = content["passages"][citation["n"] - 1]
        assert citation["chunk_id"] == cited["chunk_id"] and citation["quote"] in cited["text"]


def test_errors_are_tool_errors_without_internals(live_server: LiveServer) -> None:
    bad = _call(live_server, "search", {"query": "x", "filter": {"must": [{"key": "nope", "match": {"value": 1}}]}})
    assert bad.is_error and "INVALID_ARGUMENT: filter" in bad.content[0].text
    unknown = _call(live_server, "no_such_tool", {})
    assert unknown.is_error and "Traceback" not in unknown.content[0].text
