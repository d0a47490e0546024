"""Warming across a restart: the passages one server retrieved first most often are in the next
server's prefix cache before its first question (real servers, real engine)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from tests.e2e.servers import serving, wait_warm
from tests.e2e.test_grpc_stream import _template_tokens


async def _ask(target: str, question: str) -> tuple[pb.RetrievalEvent, pb.FinalEvent]:
    async with RagClient(target, default_timeout_s=120) as client:
        events = [e async for e in client.query(question, max_tokens=4)]
    return events[0].retrieval, events[-1].final


def test_a_restarted_server_prefills_the_most_retrieved_passage(sample_index: Path, tmp_path: Path) -> None:
    counts = tmp_path / "hot-passages.json"
    env = {
        "RAGSERVE_HOT_PASSAGES_PATH": str(counts),
        "RAGSERVE_CACHE_BACKEND": "off",
        "RAGSERVE_WARM_WHOLE_CORPUS": "false",
    }
    questions = ["Who discovered penicillin?", "In which year was penicillin discovered, and by whom?"]
    for server in serving(sample_index, tmp_path / "first.log", env):
        tops = [asyncio.run(_ask(server.target, q))[0].passages[0].chunk_id for q in questions]
    assert tops[0] == tops[1]
    assert json.loads(counts.read_text())["counts"][tops[0]] == 2  # written at shutdown

    for server in serving(sample_index, tmp_path / "second.log", env):
        wait_warm(server.target)  # warming runs after SERVING, in the background
        retrieval, final = asyncio.run(_ask(server.target, "What mould did penicillin come from?"))
    assert retrieval.passages[0].chunk_id == tops[0]
    # The first question this server answers finds the template and the whole passage cached.
    assert final.usage.prefix_cache_hit_tokens >= _template_tokens() + 64, final.usage


def test_a_fresh_server_without_history_starts_warm(sample_index: Path, tmp_path: Path) -> None:
    """No counts file: once SERVING, the whole sample corpus is pre-filled in the background, and a
    first question finds its top passage already cached."""
    env = {
        "RAGSERVE_HOT_PASSAGES_PATH": str(tmp_path / "none.json"),
        "RAGSERVE_CACHE_BACKEND": "off",
        "RAGSERVE_WARM_WHOLE_CORPUS": "true",
    }
    for server in serving(sample_index, tmp_path / "fresh.log", env):
        warming = wait_warm(server.target)
        _, final = asyncio.run(_ask(server.target, "How does the honey bee waggle dance encode distance?"))
        assert "warming done" in server.log_text()
    assert warming.passages > 0 and warming.tokens > 0
    assert final.usage.prefix_cache_hit_tokens >= _template_tokens() + 64, final.usage
