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


def test_a_restarted_server_starts_warm_the_most_retrieved_passage_first(sample_index: Path, tmp_path: Path) -> None:
    """The first server counts what it retrieves; the next one, once SERVING, pre-fills the most
    retrieved passage first and then the rest of the corpus, so both a repeat and a first visit find
    their top passage cached."""
    counts = tmp_path / "hot-passages.json"
    env = {"RAGSERVE_HOT_PASSAGES_PATH": str(counts), "RAGSERVE_CACHE_BACKEND": "off"}
    questions = ["Who discovered penicillin?", "In which year was penicillin discovered, and by whom?"]
    for server in serving(sample_index, tmp_path / "first.log", env):
        tops = [asyncio.run(_ask(server.target, q))[0].passages[0].chunk_id for q in questions]
    assert tops[0] == tops[1]
    assert json.loads(counts.read_text())["counts"][tops[0]] == 2  # written at shutdown

    for server in serving(sample_index, tmp_path / "second.log", {**env, "RAGSERVE_WARM_WHOLE_CORPUS": "true"}):
        warming = wait_warm(server.target)  # warming runs after SERVING, in the background
        retrieval, repeat = asyncio.run(_ask(server.target, "What mould did penicillin come from?"))
        _, first_visit = asyncio.run(_ask(server.target, "How does the honey bee waggle dance encode distance?"))
        assert "warming done" in server.log_text()
    assert retrieval.passages[0].chunk_id == tops[0]
    assert warming.passages > 1 and warming.tokens > 0
    # The first questions this server answers find the template and the whole passage cached.
    for final in (repeat, first_visit):
        assert final.usage.prefix_cache_hit_tokens >= _template_tokens() + 64, final.usage
