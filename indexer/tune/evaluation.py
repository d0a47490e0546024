"""Labelled queries for tuning and measuring: BEIR files in, a deterministic split, nDCG/recall out.

Everything here runs in-process over the project's own index and fusion code (`hybrid_search`,
`weighted`, `dedupe_documents`), the same order the server returns for `dedupe_documents=true`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ragserve.config import RetrievalSettings, default_of
from ragserve.embed.base import Embedder
from ragserve.index.base import ScoredChunk, SearchIndex
from ragserve.index.fusion import RetrievalOptions, dedupe_documents, plan_breadth, weighted

Qrels = dict[str, dict[str, int]]
# Salts the split of labelled queries into kept and held back (`hash_split`). Both tuners use it,
# so the cross-encoder is fitted on the same held-back queries the bi-encoder tuner was judged on.
FIT_SALT = "ragserve-tune-fit"
# The server's fusion weight for a version that has not fitted its own.
DEFAULT_DENSE_WEIGHT: float = default_of(RetrievalSettings, "fusion_dense_weight")
# The dense weights the fusion fit tries (the server's default, 0.4, is among them).
WEIGHT_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
CANDIDATES = 100
_EF_SEARCH: int = default_of(RetrievalSettings, "hnsw_ef_search")


class TuneInputError(Exception):
    """A queries or qrels file that cannot be used (missing, malformed, nothing judged)."""


def load_queries(path: Path) -> dict[str, str]:
    """BEIR queries.jsonl: one {"_id", "text"} object a line."""
    out: dict[str, str] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TuneInputError(f"cannot read queries {path}: {exc}") from None
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
            out[str(rec["_id"])] = str(rec["text"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise TuneInputError(f"{path}:{line_no}: not a BEIR query record ({exc})") from None
    if not out:
        raise TuneInputError(f"{path} holds no queries")
    return out


def load_qrels(path: Path) -> Qrels:
    """BEIR qrels TSV (query-id, corpus-id, score; a header line first); only scores > 0 are kept."""
    qrels: Qrels = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TuneInputError(f"cannot read qrels {path}: {exc}") from None
    for line_no, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) < 3 or not parts[2].strip().lstrip("-").isdigit():
            if line.strip():
                raise TuneInputError(f"{path}:{line_no}: expected query-id<TAB>corpus-id<TAB>score")
            continue
        if int(parts[2]) > 0:
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    if not qrels:
        raise TuneInputError(f"{path} holds no positive judgements")
    return qrels


def hash_split(ids: Iterable[str], fraction: float, salt: str) -> tuple[list[str], list[str]]:
    """(kept, held back): an id is held back when its salted sha256 falls in the first `fraction`
    of the hash range. Deterministic, independent of order and of which other ids exist."""
    kept: list[str] = []
    held: list[str] = []
    for qid in sorted(ids):
        bucket = int.from_bytes(hashlib.sha256(f"{salt}:{qid}".encode()).digest()[:8], "big") / 2.0**64
        (held if bucket < fraction else kept).append(qid)
    return kept, held


def ndcg_at(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: Sequence[str], relevant: dict[str, int], k: int = 100) -> float:
    return len(set(ranked[:k]) & set(relevant)) / len(relevant) if relevant else 0.0


@dataclass(frozen=True)
class Scores:
    ndcg10: float
    recall100: float
    queries: int


def score_runs(runs: dict[str, list[str]], qrels: Qrels) -> Scores:
    ids = [q for q in runs if q in qrels]
    if not ids:
        return Scores(0.0, 0.0, 0)
    return Scores(
        sum(ndcg_at(runs[q], qrels[q]) for q in ids) / len(ids),
        sum(recall_at(runs[q], qrels[q]) for q in ids) / len(ids),
        len(ids),
    )


@dataclass(frozen=True)
class CandidateLists:
    """Each query's dense and BM25 candidate lists, searched once and fused at any weight."""

    dense: dict[str, list[ScoredChunk]]
    lexical: dict[str, list[ScoredChunk]]

    def fused_documents(self, dense_weight: float, k: int = CANDIDATES) -> dict[str, list[str]]:
        """Document ids in the server's weighted-fusion order, best chunk per document."""
        out: dict[str, list[str]] = {}
        for qid, dense in self.dense.items():
            hits = dedupe_documents(weighted(dense, self.lexical.get(qid, []), dense_weight))
            out[qid] = [h.chunk.doc_id for h in hits[:k]]
        return out

    def dense_documents(self, k: int = CANDIDATES) -> dict[str, list[str]]:
        return {q: [h.chunk.doc_id for h in dedupe_documents(d)[:k]] for q, d in self.dense.items()}


def search_candidates(
    index: SearchIndex, embedder: Embedder, queries: dict[str, str], k: int = CANDIDATES
) -> CandidateLists:
    """Dense and BM25 lists for every query, as deep as the server's hybrid search takes them for
    `top_k=k, dedupe_documents=true` (`plan_breadth`, default settings)."""
    breadth = plan_breadth(RetrievalOptions(mode="hybrid"), "hybrid", k, _EF_SEARCH, dedupe=True)
    candidates, ef = breadth.candidates, breadth.ef
    dense: dict[str, list[ScoredChunk]] = {}
    lexical: dict[str, list[ScoredChunk]] = {}
    has_lexical = index.lexical_available
    for qid, text in queries.items():
        # One query at a time, as the server embeds them: int8 dynamic quantization scales the
        # activations over the whole batch, so a batched query vector differs slightly.
        vector = np.asarray(embedder.embed_query(text).vector, dtype=np.float32)
        dense[qid] = index.search(vector, candidates, ef)
        lexical[qid] = index.search_lexical(text, candidates) if has_lexical else []
    return CandidateLists(dense, lexical)


def fit_dense_weight(
    lists: CandidateLists, qrels: Qrels, grid: Sequence[float] = WEIGHT_GRID
) -> tuple[float, dict[float, float]]:
    """The weight with the best mean nDCG@10 over `lists` (ties go to the lower weight), and the grid."""
    grid_scores = {w: score_runs(lists.fused_documents(w), qrels).ndcg10 for w in grid}
    best = max(grid, key=lambda w: (grid_scores[w], -w))
    return best, grid_scores
