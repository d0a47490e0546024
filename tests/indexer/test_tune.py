"""The tuning command's parts: BEIR input checks, the deterministic split, hard-negative mining,
resumable training (on a fake tiny model), the CLI's refusals; and (slow) a whole labelled run
with the real MiniLM on the sample documents."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from indexer.cli import app
from indexer.tune.embedder_model import Example, TrainOptions, train
from indexer.tune.evaluation import CandidateLists, TuneInputError, hash_split, load_qrels, load_queries, ndcg_at
from indexer.tune.training import CHECKPOINT
from ragserve.index.base import ScoredChunk
from ragserve.types import Chunk
from tests.index.tuned_fake import interrupt_at, save_fake_tuned_model, write_sample_labels


def test_hash_split_is_deterministic_and_independent_of_order() -> None:
    ids = [str(i) for i in range(400)]
    kept, held = hash_split(ids, 0.25, "salt")
    assert (kept, held) == hash_split(list(reversed(ids)), 0.25, "salt")
    assert set(kept).isdisjoint(held) and len(kept) + len(held) == 400
    assert 70 < len(held) < 130
    # An id's side does not depend on which other ids exist.
    assert set(hash_split(ids[:100], 0.25, "salt")[1]) == {q for q in held if int(q) < 100}
    assert hash_split(ids, 0.25, "other")[1] != held


def test_beir_inputs_are_checked_with_clear_errors(tmp_path: Path) -> None:
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "1", "text": "a claim"}\n\n{"_id": 2, "text": "another"}\n')
    assert load_queries(queries) == {"1": "a claim", "2": "another"}
    queries.write_text('{"_id": "1"}\n')
    with pytest.raises(TuneInputError, match=r"queries\.jsonl:1: not a BEIR query record"):
        load_queries(queries)
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t0\n2\td3\t2\n")
    assert load_qrels(qrels) == {"1": {"d1": 1}, "2": {"d3": 2}}
    qrels.write_text("query-id\tcorpus-id\tscore\n1 d1 1\n")
    with pytest.raises(TuneInputError, match=r"qrels\.tsv:2: expected"):
        load_qrels(qrels)
    with pytest.raises(TuneInputError, match="cannot read"):
        load_queries(tmp_path / "missing.jsonl")


def test_ndcg_of_a_perfect_and_an_empty_ranking() -> None:
    assert ndcg_at(["a", "b"], {"a": 1, "b": 1}) == pytest.approx(1.0)
    assert ndcg_at(["x"], {"a": 1}) == 0.0


def _hit(doc: str, score: float, n: int = 0) -> ScoredChunk:
    return ScoredChunk(Chunk(f"{doc}#{n}", doc, f"text of {doc} {n}", title=""), score)


def test_mined_hard_negatives_skip_known_positives_and_repeat_documents() -> None:
    from indexer.tune.embedder import mine_examples

    dense = {"q": [_hit("pos", 0.9), _hit("n1", 0.8), _hit("n1", 0.7, 1), _hit("n2", 0.6), _hit("n3", 0.5)]}
    lists = CandidateLists(dense, {"q": []})
    examples = mine_examples(lists, {"q": "query"}, {"q": {"pos": 1}}, {"pos": "positive text"}, 1.0, 2)
    assert examples == [Example("query", "positive text", ("text of n1 0", "text of n2 0"))]


def test_a_relevant_document_is_learnt_from_its_best_ranked_chunk_when_asked() -> None:
    from indexer.tune.embedder import mine_examples

    dense = {"q": [_hit("n1", 0.9), _hit("pos", 0.8, 2), _hit("pos", 0.7, 0)]}
    lists = CandidateLists(dense, {"q": []})
    qrels = {"q": {"pos": 1, "missed": 1}}
    firsts = {"pos": "first chunk of pos", "missed": "first chunk of missed"}

    def render(chunk: Chunk) -> str:
        return f"best: {chunk.text}"

    examples = mine_examples(lists, {"q": "query"}, qrels, firsts, 1.0, 1, best_chunk=render)
    # The chunk the index ranked highest (chunk 2); a document the search missed keeps its first chunk.
    assert [e.positive for e in examples] == ["best: text of pos 2", "first chunk of missed"]
    assert all(e.negatives == ("text of n1 0",) for e in examples)


def _examples(n: int) -> list[Example]:
    return [Example(f"question {i}", f"answer number {i}", (f"distractor {i}",)) for i in range(n)]


@pytest.mark.slow
def test_training_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    model = save_fake_tuned_model(tmp_path / "tiny")
    opts = TrainOptions(epochs=2, batch_size=4, checkpoint_every=1)
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        train(str(model), _examples(8), opts, tmp_path / "work", "fp", progress=False, on_step=interrupt_at(3, seen))
    assert (tmp_path / "work" / CHECKPOINT).is_dir()
    final = train(str(model), _examples(8), opts, tmp_path / "work", "fp", progress=False, on_step=seen.append)
    assert seen == [1, 2, 3, 4]  # 2 epochs x 2 batches; the second run went on from step 3
    assert (final / "config.json").is_file()
    # Other examples (another fingerprint) start over instead of reusing the checkpoint.
    seen.clear()
    train(str(model), _examples(8), opts, tmp_path / "work", "other", progress=False, on_step=seen.append)
    assert seen == [1, 2, 3, 4]


def test_cli_refuses_queries_without_qrels_and_a_missing_index(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["tune", "--index", str(tmp_path), "--queries", str(tmp_path / "q.jsonl")])
    assert result.exit_code == 2 and "give both --queries and --qrels" in result.output
    result = runner.invoke(app, ["tune", "--index", str(tmp_path / "none"), "--no-progress"])
    assert result.exit_code == 2 and "no published index" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_labelled_and_label_free_runs_publish_versions_the_server_loads(tmp_path: Path, sample_index: Path) -> None:
    """The real MiniLM on the sample documents: questions written for a few documents as labels
    (forced past the held-back check: a handful of queries says little), then a label-free run
    (its default pairs; the sentence pairs are the same run on other pairs: tested below)."""
    import shutil

    from indexer.tune.embedder import TuneJob, run_tune
    from ragserve.embed.onnx_backend import OnnxEmbedder
    from ragserve.embed.tuned import TUNED_ONNX
    from ragserve.factory import serve_version
    from ragserve.index.hnsw import HnswIndex
    from tests.fakes import FakeEmbedder

    root = tmp_path / "idx"
    shutil.copytree(sample_index, root, symlinks=True)
    write_sample_labels(tmp_path)
    opts = TrainOptions(epochs=1, batch_size=4)
    job = TuneJob(root, tmp_path / "q.jsonl", tmp_path / "qrels.tsv", force=True, progress=False, train=opts)
    report = run_tune(job, say=lambda _: None)
    assert report.published and report.version == 2 and report.examples >= 4
    assert report.fit_after is not None and report.weight_after in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    index = HnswIndex.load(root)
    serving = serve_version(index, FakeEmbedder())  # as the server loads it: the version's own embedder
    assert isinstance(serving.embedder, OnnxEmbedder) and TUNED_ONNX in index.manifest.files
    assert serving.retrieval.dense_weight == report.weight_after
    assert index.manifest.tuning["method"] == "labels" and not (root / ".tune").exists()
    hits = index.search(serving.embedder.embed_query("leader election and log replication").vector, 3, 64)
    assert "raft-consensus.md" in {h.chunk.doc_id for h in hits}
    free = run_tune(TuneJob(root, max_pairs=16, progress=False, train=opts), say=lambda _: None)
    assert free.published and free.method == "corpus" and free.fit_after is None
    assert HnswIndex.load(root).manifest.tuning["method"] == "corpus:title"


def test_sentence_pairs_ask_with_one_sentence_and_learn_the_rest() -> None:
    from indexer.tune.embedder import _corpus_pairs

    body = (
        "Plants capture light with chlorophyll in their leaves. The energy splits water into oxygen. "
        "Sugar is then built from carbon dioxide in the Calvin cycle."
    )
    chunks = [Chunk(f"d{i}#0", f"d{i}", body, title=f"Photosynthesis part {i}") for i in range(5)]

    class FakeIndexChunks:
        def __init__(self) -> None:
            self.chunks = chunks

    queries, qrels, positives = _corpus_pairs(FakeIndexChunks(), 4, 1, "sentence")  # type: ignore[arg-type]
    assert len(queries) == 4 and all(qrels[d] == {d: 1} for d in queries)
    for doc, sentence in queries.items():
        assert sentence in body and sentence not in positives[doc]
        assert positives[doc].startswith(f"Photosynthesis part {doc[1:]}\n")  # title kept, as indexed
