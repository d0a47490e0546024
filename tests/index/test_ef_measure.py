"""The indexer measures the HNSW breadth a version needs for recall@10 against exact search, and
the server searches the version at least that wide."""

from __future__ import annotations

from pathlib import Path

import hnswlib
import numpy as np

from ragserve.index.fusion import RetrievalOptions, plan_breadth
from ragserve.index.hnsw_build import EF_RECALL_TARGET, EF_STEPS, build_hnsw, exact_top


def _recall(index: hnswlib.Index, probes: np.ndarray, vectors: np.ndarray, ef: int) -> float:
    truth = exact_top(probes, vectors, 10)
    index.set_ef(ef)
    labels, _ = index.knn_query(probes, k=10)
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(labels.tolist(), truth.tolist(), strict=True)]))


def test_the_measured_ef_is_the_least_that_reaches_the_target(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(50, 48))
    vectors = (centres[rng.integers(0, 50, 6000)] + rng.normal(scale=0.8, size=(6000, 48))).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ef = build_hnsw(vectors, tmp_path / "g.bin", m=8, ef_construction=40)
    index = hnswlib.Index(space="ip", dim=48)
    index.load_index(str(tmp_path / "g.bin"))
    # The same kind of probes measure_ef uses (halfway between two stored vectors), other draws.
    probes = vectors[rng.integers(0, 6000, 300)] + vectors[rng.integers(0, 6000, 300)]
    probes /= np.linalg.norm(probes, axis=1, keepdims=True)
    assert ef in EF_STEPS and _recall(index, probes, vectors, ef) >= EF_RECALL_TARGET - 0.02
    if ef != EF_STEPS[0]:
        assert _recall(index, probes, vectors, EF_STEPS[EF_STEPS.index(ef) - 1]) < EF_RECALL_TARGET + 0.01


def test_the_server_searches_a_version_at_least_as_wide_as_measured(tmp_path: Path) -> None:
    options = RetrievalOptions(mode="dense").for_version(None, ef_floor=256)
    assert plan_breadth(options, "dense", 10, 64, False).ef == 256
    assert plan_breadth(RetrievalOptions(mode="dense"), "dense", 10, 64, False).ef == 64
    assert build_hnsw(np.eye(4, dtype=np.float32), tmp_path / "g.bin") == 0  # too few to measure
