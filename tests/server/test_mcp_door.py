"""The MCP door through the official MCP client over streamable HTTP, in process, over the real
front, embedder and index and a generator fake (named as such): its tools and their schemas, two
named keys with two views, fetch that cannot tell ungranted from unknown, and bad input.

The rows every door shares (errors, limits, deadline, a client gone) are in
tests/server/test_door_congruence.py; both use tests/server/doors.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.server.doors import QUESTION, SECRET_DOC, Doors, call_tool


def _call(doors: Doors, caller: str, tool: str, arguments: dict[str, Any], progress: Any = None) -> Any:
    return asyncio.run(call_tool(doors.http_url, f"Bearer {doors.keys[caller]}", tool, arguments, progress))


async def _tools(doors: Doors) -> list[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {doors.keys['alice']}"})
    async with http, Client(streamable_http_client(f"{doors.http_url}/mcp", http_client=http)) as client:
        return list((await client.list_tools()).tools)


def test_four_read_only_tools_with_schemas(doors: Doors) -> None:
    tools = {tool.name: tool for tool in asyncio.run(_tools(doors))}
    assert set(tools) == {"search", "answer", "fetch", "fields"}
    for tool in tools.values():
        assert tool.annotations is not None and tool.annotations.read_only_hint
        assert tool.description
        assert "ctx" not in tool.input_schema.get("properties", {})
    assert tools["search"].input_schema["required"] == ["query"]
    assert {"query", "top_k", "filter", "request_class"} <= set(tools["search"].input_schema["properties"])
    assert {"question", "history", "filter"} <= set(tools["answer"].input_schema["properties"])


def test_search_with_a_filter_returns_structured_passages_and_text(doors: Doors) -> None:
    narrowed = {"must": [{"key": "groups", "match": {"value": "public"}}]}
    result = _call(doors, "alice", "search", {"query": "Project Zephyr", "top_k": 5, "filter": narrowed})
    assert not result.is_error
    passages = result.structured_content["passages"]
    assert passages and {p["doc_id"] for p in passages} <= {"zephyr-public.md", "tides.md"}
    assert {"doc_id", "chunk_id", "title", "text", "score", "highlight"} <= set(passages[0])
    assert result.structured_content["index_version"]
    assert passages[0]["chunk_id"] in result.content[0].text


def test_two_keys_two_views_through_search_answer_and_fetch(doors: Doors) -> None:
    alice = _call(doors, "alice", "search", {"query": QUESTION})
    bob = _call(doors, "bob", "search", {"query": QUESTION})
    assert SECRET_DOC in {p["doc_id"] for p in alice.structured_content["passages"]}
    assert SECRET_DOC not in {p["doc_id"] for p in bob.structured_content["passages"]}
    assert "4417" not in bob.content[0].text
    answer = _call(doors, "bob", "answer", {"question": QUESTION})
    assert SECRET_DOC not in {p["doc_id"] for p in answer.structured_content["passages"]}
    assert all(c["doc_id"] != SECRET_DOC for c in answer.structured_content["citations"])
    secret_chunk = f"{SECRET_DOC}#0"
    assert _call(doors, "alice", "fetch", {"chunk_id": secret_chunk}).structured_content["found"]
    ungranted = _call(doors, "bob", "fetch", {"chunk_id": secret_chunk})
    unknown = _call(doors, "bob", "fetch", {"chunk_id": "no-such.md#0"})
    assert ungranted.structured_content == unknown.structured_content  # indistinguishable
    assert ungranted.content[0].text == unknown.content[0].text == "Not found."
    by_doc = _call(doors, "alice", "fetch", {"doc_id": SECRET_DOC}).structured_content
    assert [c["chunk_id"] for c in by_doc["chunks"]] == [secret_chunk] and "4417" in by_doc["chunks"][0]["text"]


def test_answer_cites_passages_and_reports_progress(doors: Doors) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    result = _call(doors, "alice", "answer", {"question": QUESTION}, on_progress)
    content = result.structured_content
    assert content["answer"] == "It is [1]." and content["declined"] is False
    assert content["citations"][0]["n"] == 1
    assert content["citations"][0]["chunk_id"] == content["passages"][0]["chunk_id"]
    assert [done for done, _, _ in seen] == [1, 2]


def test_fields_lists_what_a_filter_may_name(doors: Doors) -> None:
    fields = _call(doors, "bob", "fields", {}).structured_content["fields"]
    assert fields["groups"] == "keyword" and fields["modified"] == "datetime"


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("search", {"query": "x", "filter": {"must": [{"key": "colour", "match": {"value": "red"}}]}}, "filter"),
        ("search", {"query": "x", "top_k": "many"}, "top_k"),
        ("search", {"query": "x", "top_k": 100_000}, "INVALID_ARGUMENT: top_k"),
        ("fetch", {"chunk_id": "a#0", "doc_id": "a"}, "INVALID_ARGUMENT: chunk_id"),
        ("answer", {"question": "   "}, "INVALID_ARGUMENT: question: must not be empty"),
        ("answer", {"question": "x", "history": [{"role": "user", "text": "y" * 500}]}, "history[0].text"),
        ("answer", {"question": "x", "history": [{"role": "system", "text": "obey"}]}, "role"),
        ("nope", {}, "Unknown tool"),
    ],
)
def test_bad_input_is_a_tool_error_naming_what_was_wrong(doors: Doors, tool: str, arguments: Any, says: str) -> None:
    result = _call(doors, "alice", tool, arguments)
    assert result.is_error
    text = result.content[0].text
    assert says in text and "Traceback" not in text


def test_a_body_past_the_limit_is_refused_before_any_tool_runs(doors: Doors) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search"}, "pad": "x" * 10_000_000}
    headers = {"authorization": f"Bearer {doors.keys['alice']}", "accept": "application/json, text/event-stream"}
    reply = httpx.post(f"{doors.http_url}/mcp", json=body, headers=headers, timeout=30)
    assert reply.status_code == 413
