from __future__ import annotations

from ragserve.index.base import ScoredChunk
from ragserve.index.fusion import RetrievalOptions, SearchBreadth, dedupe_documents, plan_breadth, rrf, weighted
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


def test_breadth_is_planned_once_and_a_cut_is_flagged_only_when_real() -> None:
    hybrid = RetrievalOptions(mode="hybrid", candidates=100)
    assert plan_breadth(hybrid, "hybrid", 3, 64, dedupe=False) == SearchBreadth(3, 3, 100, 100)
    # Budget nearly spent: hybrid lists already ask for more than ef_search, so nothing is cut.
    assert plan_breadth(hybrid, "hybrid", 3, 64, dedupe=False, narrow=True) == SearchBreadth(3, 3, 100, 100)
    # Dense: HNSW looks only as wide as the results it returns, and says so.
    assert plan_breadth(hybrid, "dense", 3, 64, dedupe=False) == SearchBreadth(3, 3, 3, 64)
    assert plan_breadth(hybrid, "dense", 3, 64, dedupe=False, narrow=True) == SearchBreadth(3, 3, 3, 3, cut=True)
    # Deduplicating to documents looks deeper; ef never drops below what is asked for.
    assert plan_breadth(hybrid, "dense", 30, 64, dedupe=True) == SearchBreadth(30, 90, 90, 90)
    assert plan_breadth(hybrid, "dense", 30, 64, dedupe=True, narrow=True).cut is False
    assert plan_breadth(hybrid, "hybrid", 50, 64, dedupe=True) == SearchBreadth(50, 150, 150, 150)


def test_fused_hits_keep_their_raw_cosine_and_bm25_score() -> None:
    from ragserve.index.base import ScoredChunk
    from ragserve.index.fusion import weighted, with_raw_scores
    from ragserve.types import Chunk

    a, b, c = (Chunk(cid, cid, cid) for cid in "abc")
    dense = [ScoredChunk(a, 0.8), ScoredChunk(b, 0.6)]
    lexical = [ScoredChunk(b, 9.0), ScoredChunk(c, 3.0)]
    hits = {h.chunk.chunk_id: h for h in with_raw_scores(weighted(dense, lexical, 0.5), dense, lexical)}
    assert (hits["a"].dense, hits["a"].lexical) == (0.8, 3.0)  # not in BM25's list: at most its last
    assert (hits["b"].dense, hits["b"].lexical) == (0.6, 9.0)
    assert (hits["c"].dense, hits["c"].lexical) == (0.6, 3.0)
    alone = with_raw_scores(weighted(dense, [], 0.5), dense, [])
    assert [h.lexical for h in alone] == [0.0, 0.0]  # no chunk shares a term with the question
