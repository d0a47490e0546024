"""The rerank stage inside RagPipeline.retrieve: real embedder, real index, MiniLM-shaped test tiers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.request.pipeline import RagPipeline
from ragserve.rerank.onnx_cross_encoder import OnnxCrossEncoder
from ragserve.rerank.per_version import SameReranker
from ragserve.rerank.tiered import Tier, TieredReranker
from ragserve.types import RetrieveParams

# Every test here builds the MiniLM-shaped test models and exports them to ONNX.
pytestmark = pytest.mark.slow

QUESTION = "Who discovered penicillin?"


@pytest.fixture(scope="module")
def reranker(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TieredReranker:
    cache = tmp_path_factory.mktemp("onnx")
    tiers = [
        Tier("tier1", OnnxCrossEncoder(str(test_models["l2"]), "T1", cache, max_seq_len=128), 10, 4),
        Tier("tier2", OnnxCrossEncoder(str(test_models["l6"]), "T2", cache, max_seq_len=128), 3, 4),
    ]
    r = TieredReranker(tiers, candidates=10, reserve_ms=2.0, max_seq_len=128)
    r.warm_up()
    return r


def run(pipeline: RagPipeline, budget_ms: int, top_k: int = 3):
    params = RetrieveParams(QUESTION, top_k=top_k, budget_ms=budget_ms)
    return asyncio.run(pipeline.retrieve(params, RequestContext(Deadline(budget_ms))))


def test_rerank_stage_reports_tiers_and_keeps_top_k(
    sample_index: Path, embedder: SentenceTransformerEmbedder, reranker: TieredReranker
) -> None:
    with ThreadPoolExecutor(2) as executor:
        pipeline = assemble_pipeline(
            embedder, HnswIndex.load(sample_index), None, executor, rerankers=SameReranker(reranker)
        )
        result = run(pipeline, budget_ms=60_000)
    assert result.rerank_tiers == ["tier1:10", "tier2:3"]
    assert not result.degraded.rerank_skipped and not result.degraded.rerank_truncated
    assert len(result.passages) == 3 and [p.rank for p in result.passages] == [1, 2, 3]
    assert result.timings.rerank_ms > 0
    assert all(c.cost is not None and c.cost.ms_per_token > 0 for c in reranker.tiers)


def test_ten_ms_budget_still_returns_the_fused_order_flagged(
    sample_index: Path, embedder: SentenceTransformerEmbedder, reranker: TieredReranker
) -> None:
    with ThreadPoolExecutor(2) as executor:
        plain = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor)
        reranked = assemble_pipeline(
            embedder, HnswIndex.load(sample_index), None, executor, rerankers=SameReranker(reranker)
        )
        expected = run(plain, budget_ms=60_000, top_k=3)
        result = run(reranked, budget_ms=10, top_k=3)
    assert len(result.passages) == 3
    # Embedding alone takes about the whole 10 ms here, so no pair fits: the fused order is served.
    assert result.rerank_tiers == [] or result.degraded.rerank_truncated
    if not result.rerank_tiers:
        assert result.degraded.rerank_skipped
        assert [p.chunk.chunk_id for p in result.passages] == [p.chunk.chunk_id for p in expected.passages]
    assert result.degraded.notes
