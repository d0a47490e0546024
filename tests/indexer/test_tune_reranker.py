"""The cross-encoder tuner's parts: group mining in the served chunk form, the blend fit over
depths and weights, and resumable training (on a fake tiny model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.tune.evaluation import CandidateLists
from indexer.tune.reranker import fit_ce_weight, mine_groups, score_blends
from indexer.tune.reranker_model import RerankGroup, RerankTrainOptions, train_cross_encoder
from indexer.tune.training import CHECKPOINT
from ragserve.index.base import ScoredChunk
from ragserve.types import Chunk
from tests.index.tuned_fake import interrupt_at, save_fake_tuned_model, write_sample_labels


class _FakeIndexChunks:
    """Only what mining reads of an index: its chunks, in row order."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks


def _chunk(doc: str, n: int = 0) -> Chunk:
    return Chunk(f"{doc}#{n}", doc, f"text of {doc} {n}", title=f"title {doc}")


def test_groups_learn_the_relevant_documents_best_ranked_chunk_against_sampled_hard_negatives() -> None:
    dense = [
        ScoredChunk(_chunk(d, n), s) for d, n, s in [("n1", 0, 0.9), ("pos", 1, 0.8), ("n2", 0, 0.7), ("n3", 0, 0.6)]
    ]
    dense += [ScoredChunk(_chunk(f"x{i}"), 0.5 - i / 100) for i in range(10)]
    lists = CandidateLists({"q": dense}, {"q": []})
    index = _FakeIndexChunks([_chunk("pos", 0), _chunk("pos", 1), _chunk("gone", 0)])
    qrels = {"q": {"pos": 1, "gone": 1}}
    groups = mine_groups(index, lists, {"q": "query"}, qrels, 1.0, 3, seed=1)  # type: ignore[arg-type]
    # The chunk the index ranked (chunk 1), not the first; a relevant document the search missed
    # is learnt from its first chunk. Both share one set of negatives, none of them relevant.
    assert [g.positive for g in groups] == ["text of pos 1", "text of gone 0"]
    negatives = groups[0].negatives
    assert len(negatives) == 3 and groups[1].negatives == negatives
    assert not any("pos" in n or "gone" in n for n in negatives)
    assert all(n.startswith("text of ") for n in negatives)  # chunk text, as the server scores it
    assert mine_groups(index, lists, {"q": "query"}, qrels, 1.0, 3, seed=1) == groups  # type: ignore[arg-type]


def test_blend_fit_scores_every_depth_and_weight_and_prefers_the_fused_order_on_ties() -> None:
    # The fused order puts the relevant document third; the fake scorer knows it is best.
    dense = [ScoredChunk(_chunk(d), s) for d, s in [("a", 0.9), ("b", 0.8), ("rel", 0.7), ("c", 0.1)]]
    lists = CandidateLists({"q": dense}, {"q": []})

    def fake_scores(query: str, texts: object) -> np.ndarray:
        return np.array([5.0 if "rel" in t else -5.0 for t in texts])  # type: ignore[attr-defined]

    grid = score_blends(
        fake_scores, lists, {"q": "query"}, {"q": {"rel": 1}}, 1.0, depths=(2, 3), ce_weights=(0.0, 0.5)
    )
    assert grid[(2, 0.0)] == grid[(3, 0.0)] == grid[(2, 0.5)] == pytest.approx(0.5)  # depth 2 never sees it
    assert grid[(3, 0.5)] == pytest.approx(1.0)
    assert fit_ce_weight(grid, depths=(2, 3)) == 0.5
    flat = dict.fromkeys(grid, 0.7)
    assert fit_ce_weight(flat, depths=(2, 3)) == 0.0


def _groups(n: int) -> list[RerankGroup]:
    return [RerankGroup(f"question {i}", f"answer number {i}", (f"distractor {i}", f"other {i}")) for i in range(n)]


@pytest.mark.slow
def test_reranker_training_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    save_fake_tuned_model(tmp_path / "tiny")
    raw = tmp_path / ".tiny-raw"  # the fake's plain BERT folder: a cross-encoder starts from it
    opts = RerankTrainOptions(layers=1, epochs=2, groups_per_step=4, checkpoint_every=1, max_seq_len=32)
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        train_cross_encoder(
            str(raw), _groups(8), opts, tmp_path / "work", "fp", progress=False, on_step=interrupt_at(3, seen)
        )
    assert (tmp_path / "work" / CHECKPOINT).is_dir()
    final = train_cross_encoder(str(raw), _groups(8), opts, tmp_path / "work", "fp", False, seen.append)
    assert seen == [1, 2, 3, 4]
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="at least one negative"):
        train_cross_encoder(str(raw), [RerankGroup("q", "p", ())] * 2, opts, tmp_path / "w2", "fp", False)


@pytest.mark.slow
def test_a_tuned_reranker_is_published_with_the_version_and_loaded_by_the_server(
    tmp_path: Path, sample_index: Path
) -> None:
    """The real MiniLM's first layer on the sample documents, a few labelled questions: a new
    version ships the exported model and the fitted blend, and loads the way the server loads it."""
    import shutil

    from indexer.tune.reranker import CE_WEIGHTS, FIT_DEPTHS, RerankTuneJob, run_tune_reranker
    from ragserve.factory import load_tuned_reranker
    from ragserve.index.hnsw import HnswIndex
    from ragserve.rerank.tuned import TUNED_ONNX

    root = tmp_path / "idx"
    shutil.copytree(sample_index, root, symlinks=True)
    queries, qrels = write_sample_labels(tmp_path)
    opts = RerankTrainOptions(layers=1, epochs=1, groups_per_step=2, max_seq_len=128)
    job = RerankTuneJob(root, queries, qrels, negatives=3, fit_fraction=0.3, progress=False, train=opts)
    report = run_tune_reranker(job, say=lambda _: None)
    assert report.version == 2 and report.groups >= 3 and report.fit_queries >= 1
    assert report.ce_weight in CE_WEIGHTS and set(report.by_depth) == set(FIT_DEPTHS)
    index = HnswIndex.load(root)
    tuned = load_tuned_reranker(index.folder, index.manifest, threads=1)  # as the server loads it
    assert tuned is not None and TUNED_ONNX in index.manifest.files
    assert tuned.ce_weight == report.ce_weight
    assert tuned.beats_fused == report.beats_fused
    record = index.manifest.tuning["reranker"]
    assert record["layers"] == 1 and record["fit_queries"] == report.fit_queries
    assert not (root / ".tune-reranker").exists()
    scores = tuned.encoder.score(
        tuned.encoder.encode("how do plants turn light into sugar", ["chlorophyll", "tcp syn ack"])
    )
    assert scores.shape == (2,)
    # Re-tuning the bi-encoder changes the fused order the blend was fitted on: the new version
    # leaves the cross-encoder behind (tune it again for the new order).
    from indexer.tune.embedder import TuneJob, run_tune
    from indexer.tune.embedder_model import TrainOptions

    retuned = TuneJob(root, queries, qrels, force=True, progress=False, train=TrainOptions(epochs=1, batch_size=4))
    assert run_tune(retuned, say=lambda _: None).published
    index = HnswIndex.load(root)
    assert load_tuned_reranker(index.folder, index.manifest, threads=1) is None and not any(
        f.startswith("reranker/") for f in index.manifest.files
    )


def test_cli_needs_labels_and_an_index(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from indexer.cli import app

    queries, qrels = write_sample_labels(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["tune-reranker", "--index", str(tmp_path / "none"), "--no-progress"])
    assert result.exit_code == 2 and "--queries" in result.output
    args = ["tune-reranker", "--index", str(tmp_path / "none"), "--queries", str(queries), "--qrels", str(qrels)]
    result = runner.invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 2 and "no published index" in result.output
    assert "Traceback" not in result.output
