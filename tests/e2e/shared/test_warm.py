"""Warming across a restart: the passages an earlier server retrieved first most often are in the
next server's prefix cache before its first question (real server, real engine). That a server
writes its counts when it stops is checked by the graceful-shutdown test in test_hardening.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ragserve.client import RagClient
from ragserve.v1 import rag_pb2 as pb
from tests.e2e.servers import LiveServer, serving, template_tokens, wait_warm


def _shared_with_warming(passage: pb.Passage) -> int:
    """Tokens a question's prompt with `passage` on top (and another passage after it) shares with
    the prompt warming pre-filled for it, as the server renders both (pad included)."""
    from ragserve.config import GeneratorSettings, default_generator_path
    from ragserve.generate.rendering import ChatRenderer
    from ragserve.prompt import build_prompt
    from ragserve.types import Chunk, Passage

    renderer = ChatRenderer(str(default_generator_path()), 32, GeneratorSettings().reuse_pad_max_tokens)
    renderer.load()
    top = Passage(Chunk(passage.chunk_id, passage.doc_id, passage.text, passage.title), 1.0)
    other = Passage(Chunk("other#0", "other", "Another passage.", "Other"), 0.5)
    warm, asked = (
        renderer.encode(renderer.render(build_prompt(q, passages, "reusable", warmed=True)))
        for q, passages in (("", [top]), ("A question?", [top, other]))
    )
    return next(i for i, (a, b) in enumerate(zip(warm, asked, strict=False)) if a != b)


async def _ask(target: str, question: str) -> tuple[pb.RetrievalEvent, pb.FinalEvent]:
    async with RagClient(target, default_timeout_s=120) as client:
        events = [e async for e in client.query(question, max_tokens=4)]
    return events[0].retrieval, events[-1].final


async def _top_chunk(target: str, question: str) -> str:
    async with RagClient(target) as client:
        return (await client.retrieve(question)).passages[0].chunk_id


def test_a_restarted_server_starts_warm_the_most_retrieved_passage_first(
    sample_index: Path, tmp_path: Path, retrieval_server: LiveServer
) -> None:
    """Counts as an earlier server saved them; the next one, once SERVING, pre-fills the most
    retrieved passage first and then the rest of the corpus, so both a repeat and a first visit find
    their top passage cached."""
    top = asyncio.run(_top_chunk(retrieval_server.target, "Who discovered penicillin?"))
    counts = tmp_path / "hot-passages.json"
    counts.write_text(json.dumps({"format": 1, "counts": {top: 2}}))
    # Four passages: the hot one, then the first three in the index's order (bloom-filters.txt's).
    env = {"RAGSERVE_HOT_PASSAGES_PATH": str(counts), "RAGSERVE_CACHE_BACKEND": "off", "RAGSERVE_WARM_PASSAGES": "4"}
    for server in serving(sample_index, tmp_path / "server.log", {**env, "RAGSERVE_WARM_WHOLE_CORPUS": "true"}):
        warming = wait_warm(server.target)  # warming runs after SERVING, in the background
        retrieval, repeat = asyncio.run(_ask(server.target, "What mould did penicillin come from?"))
        visited, first_visit = asyncio.run(_ask(server.target, "How does a Bloom filter answer membership queries?"))
        assert "warming done" in server.log_text()
    assert retrieval.passages[0].chunk_id == top
    assert warming.passages == 4 and warming.tokens > 0
    # The first questions this server answers find the template and the whole passage cached.
    for event, final in ((retrieval, repeat), (visited, first_visit)):
        assert final.usage.prefix_cache_hit_tokens >= template_tokens() + 64, final.usage
        # Every whole KV block the prompt shares with warming's: with the pad, that is the whole
        # top passage when a short pad brought it to a block's end (generate/rendering.py).
        assert final.usage.prefix_cache_hit_tokens >= _shared_with_warming(event.passages[0]) // 32 * 32
