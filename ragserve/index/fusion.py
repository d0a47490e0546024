"""Hybrid retrieval: dense and BM25 candidate lists fused (RRF or weighted), optional dedupe to documents.

Pure functions over the index Protocols, so every backend (hnswlib, Qdrant) gets the same fusion.
How far a search looks is decided in one place, `plan_breadth`; `hybrid_search` only follows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from ragserve.config import RetrievalSettings, default_of
from ragserve.filters import Filter
from ragserve.index.base import ScoredChunk, SearchIndex

Mode = Literal["dense", "bm25", "hybrid"]
Fusion = Literal["rrf", "weighted"]
_DEFAULT_MODE: Mode = default_of(RetrievalSettings, "retrieval_mode")
_DEFAULT_FUSION: Fusion = default_of(RetrievalSettings, "fusion")


@dataclass(frozen=True, slots=True)
class RetrievalOptions:
    mode: Mode = _DEFAULT_MODE
    fusion: Fusion = _DEFAULT_FUSION
    # RRF's constant: 60 is the value from the original paper and works without tuning.
    rrf_k: int = default_of(RetrievalSettings, "rrf_k")
    # Weighted fusion: weight of the dense list (BM25 gets 1 - weight) after min-max normalization.
    dense_weight: float = default_of(RetrievalSettings, "fusion_dense_weight")
    # Candidates taken from each list before fusing; at least top_k.
    candidates: int = default_of(RetrievalSettings, "fusion_candidates")
    # When deduplicating to documents, look this many times deeper so enough distinct documents remain.
    dedupe_depth_factor: int = 3
    # Serve a version with the dense weight fitted for it, if it records one (`for_version`).
    weight_from_index: bool = default_of(RetrievalSettings, "fusion_weight_from_index")
    # The least HNSW breadth for this version: what the indexer measured its graph needs for recall
    # (manifest hnsw.ef_search; it grows with the corpus). The configured ef_search is a floor too.
    ef_floor: int = 0

    def for_version(self, fitted_weight: float | None, ef_floor: int = 0) -> RetrievalOptions:
        """The options one version is searched with: the dense weight `ragserve-index tune` fitted for it
        (its manifest's) replaces the configured one, unless that is switched off; and the breadth
        its graph was measured to need."""
        options = replace(self, ef_floor=ef_floor) if ef_floor != self.ef_floor else self
        if not self.weight_from_index or fitted_weight is None or fitted_weight == self.dense_weight:
            return options
        return replace(options, dense_weight=fitted_weight)

    def cache_tag(self, dedupe: bool) -> str:
        """Everything here that changes a result list, for cache keys. (A version's fitted weight
        is in its identity, which every key holds; switching its use off is named here.)"""
        return (
            f"mode={self.mode},fusion={self.fusion},rrf_k={self.rrf_k},w={self.dense_weight},"
            f"n={self.candidates},dedupe={int(dedupe)}{'' if self.weight_from_index else ',w_index=0'}"
        )


def rrf(lists: Sequence[Sequence[ScoredChunk]], k: int) -> list[ScoredChunk]:
    """Reciprocal rank fusion: score = sum over lists of 1 / (k + rank)."""
    scores: dict[str, float] = {}
    chunks: dict[str, ScoredChunk] = {}
    for hits in lists:
        for rank, hit in enumerate(hits, start=1):
            cid = hit.chunk.chunk_id
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
            chunks.setdefault(cid, hit)
    order = sorted(scores, key=lambda c: (-scores[c], c))
    return [ScoredChunk(chunks[c].chunk, scores[c]) for c in order]


def _minmax(hits: Sequence[ScoredChunk]) -> dict[str, float]:
    if not hits:
        return {}
    values = np.asarray([h.score for h in hits], dtype=np.float64)
    low, span = float(values.min()), float(values.max() - values.min())
    if span <= 0.0:
        return {h.chunk.chunk_id: 1.0 for h in hits}
    return {h.chunk.chunk_id: (h.score - low) / span for h in hits}


def weighted(dense: Sequence[ScoredChunk], lexical: Sequence[ScoredChunk], dense_weight: float) -> list[ScoredChunk]:
    """Convex combination of min-max normalized scores; a chunk missing from a list scores 0 there."""
    d, b = _minmax(dense), _minmax(lexical)
    chunks = {h.chunk.chunk_id: h for h in (*lexical, *dense)}
    fused = {cid: dense_weight * d.get(cid, 0.0) + (1.0 - dense_weight) * b.get(cid, 0.0) for cid in chunks}
    order = sorted(fused, key=lambda c: (-fused[c], c))
    return [ScoredChunk(chunks[c].chunk, fused[c]) for c in order]


def dedupe_documents(hits: Sequence[ScoredChunk]) -> list[ScoredChunk]:
    """Keep each document's best-ranked chunk (input is best first)."""
    seen: set[str] = set()
    out = []
    for hit in hits:
        if hit.chunk.doc_id not in seen:
            seen.add(hit.chunk.doc_id)
            out.append(hit)
    return out


@dataclass(frozen=True, slots=True)
class SearchBreadth:
    """How far one search looks, decided once per request by `plan_breadth` and used as is.

    `depth` results are asked of each list (k, or more when deduplicating to documents); hybrid
    fusion takes `candidates` from each list; `ef` is the HNSW breadth (never below what is asked).
    `cut` says the budget made it narrower than the settings ask for.
    """

    k: int
    depth: int
    candidates: int
    ef: int
    cut: bool = False


def effective_mode(index: SearchIndex, options: RetrievalOptions) -> Mode:
    """The mode that can run: an index built before BM25 existed answers dense-only."""
    lexical = index.lexical_available
    return options.mode if lexical else "dense"


def plan_breadth(
    options: RetrievalOptions, mode: Mode, k: int, ef_search: int, dedupe: bool, narrow: bool = False
) -> SearchBreadth:
    """The one place search breadth is decided. `narrow` (budget nearly spent): HNSW looks no wider
    than the candidates it must return (ef_search is dropped), flagged as cut only when that is
    really less (a hybrid search's candidate lists already ask for more than ef_search)."""
    depth = k * options.dedupe_depth_factor if dedupe else k
    candidates = max(options.candidates, depth) if mode == "hybrid" else depth
    ef = max(ef_search, options.ef_floor, candidates)
    if narrow and candidates < ef:
        return SearchBreadth(k, depth, candidates, candidates, cut=True)
    return SearchBreadth(k, depth, candidates, ef)


def hybrid_search(
    index: SearchIndex,
    query: str,
    query_vector: np.ndarray,
    breadth: SearchBreadth,
    options: RetrievalOptions,
    mode: Mode,
    dedupe: bool = False,
    flt: Filter | None = None,
) -> list[ScoredChunk]:
    """The top `breadth.k` chunks (or documents, if `dedupe`) for one query, in `mode`
    (see `effective_mode`). `flt` narrows both lists before fusion, so a selective filter still
    fills top_k when enough chunks pass it."""
    if mode == "dense":
        hits = [replace(h, dense=h.score) for h in index.search(query_vector, breadth.depth, breadth.ef, flt)]
    elif mode == "bm25":
        hits = [replace(h, lexical=h.score) for h in index.search_lexical(query, breadth.depth, flt)]
    else:
        dense = index.search(query_vector, breadth.candidates, breadth.ef, flt)
        bm25 = index.search_lexical(query, breadth.candidates, flt)
        if options.fusion == "rrf":
            hits = rrf([dense, bm25], options.rrf_k)
        else:
            hits = weighted(dense, bm25, options.dense_weight)
        hits = with_raw_scores(hits, dense, bm25)
    if dedupe:
        hits = dedupe_documents(hits)
    return list(hits[: breadth.k])


def with_raw_scores(
    fused: Sequence[ScoredChunk], dense: Sequence[ScoredChunk], lexical: Sequence[ScoredChunk]
) -> list[ScoredChunk]:
    """Each fused hit with its raw cosine and BM25 score (a fused score only ranks; the decline
    needs to know how close the best chunk really is). A hit missing from a list gets that list's
    last score, a bound its own cannot exceed (0 for BM25 when no chunk shares a term)."""
    cosine = {h.chunk.chunk_id: h.score for h in dense}
    bm25 = {h.chunk.chunk_id: h.score for h in lexical}
    dense_floor = min(cosine.values(), default=None)
    lexical_floor = min(bm25.values(), default=0.0)
    return [
        replace(h, dense=cosine.get(h.chunk.chunk_id, dense_floor), lexical=bm25.get(h.chunk.chunk_id, lexical_floor))
        for h in fused
    ]
