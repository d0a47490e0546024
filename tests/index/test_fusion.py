from __future__ import annotations

from ragserve.index.base import ScoredChunk
from ragserve.index.fusion import dedupe_documents, rrf, weighted
from ragserve.types import Chunk


def hit(cid: str, score: float) -> ScoredChunk:
    return ScoredChunk(Chunk(cid, cid.split("#")[0], f"text {cid}"), score)


def test_rrf_rewards_agreement() -> None:
    dense = [hit("a#0", 0.9), hit("b#0", 0.8), hit("c#0", 0.7)]
    bm25 = [hit("d#0", 12.0), hit("b#0", 9.0), hit("e#0", 1.0)]
    fused = rrf([dense, bm25], k=60)
    assert fused[0].chunk.chunk_id == "b#0"  # second in both lists beats first in one
    assert fused[0].score == 2 / 62
    assert {h.chunk.chunk_id for h in fused} == {"a#0", "b#0", "c#0", "d#0", "e#0"}


def test_weighted_uses_the_weight() -> None:
    dense = [hit("a#0", 0.9), hit("b#0", 0.1)]
    bm25 = [hit("b#0", 10.0), hit("a#0", 0.0)]
    assert weighted(dense, bm25, 0.9)[0].chunk.chunk_id == "a#0"
    assert weighted(dense, bm25, 0.1)[0].chunk.chunk_id == "b#0"


def test_dedupe_keeps_best_chunk_per_document() -> None:
    hits = [hit("a#1", 0.9), hit("a#0", 0.8), hit("b#0", 0.7), hit("a#2", 0.6)]
    assert [h.chunk.chunk_id for h in dedupe_documents(hits)] == ["a#1", "b#0"]
