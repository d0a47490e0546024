"""`indexer tune`: adapt the bi-encoder to the corpus an index serves, then publish a new version.

With labels (BEIR queries.jsonl + qrels): part of the queries is held back to fit the fusion
weight and to judge the result (never trained on); the rest become (query, relevant chunk) pairs
with hard negatives from the index's own hybrid search (known positives excluded). Without labels:
(title, body) pairs of the corpus's own documents, hard negatives mined the same way with the title
as the query. Training: embedder_model.py; publishing: publish.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexer.chunking import embedding_text
from indexer.root_lock import index_root_lock
from indexer.tune.embedder_model import Example, TrainOptions, train
from indexer.tune.evaluation import (
    DEFAULT_DENSE_WEIGHT,
    FIT_SALT,
    CandidateLists,
    Qrels,
    TuneInputError,
    fit_dense_weight,
    hash_split,
    load_qrels,
    load_queries,
    score_runs,
    search_candidates,
)
from indexer.tune.publish import build_tuned_version
from ragserve.config import EmbedderSettings
from ragserve.embed.base import Embedder, resolve_embedder_path
from ragserve.factory import load_tuned_embedder, serve_version
from ragserve.index.format import latest_version, publish
from ragserve.index.fusion import weighted
from ragserve.index.hnsw import HnswIndex
from ragserve.index.shipped import fitted_weight
from ragserve.request.sentences import split_sentences
from ragserve.request.serving import ServingVersion
from ragserve.types import Chunk


@dataclass(frozen=True)
class TuneJob:
    root: Path
    queries: Path | None = None  # with qrels: labelled tuning; neither: pairs from the corpus
    qrels: Path | None = None
    work: Path | None = None  # checkpoints (default: <root>/.tune); removed once published
    hard_negatives: int = 1
    fit_fraction: float = 0.2
    max_pairs: int = 1000  # label-free: documents sampled for pairs
    # Label-free pairs: a document's title -> its body, or one of its sentences -> the rest of it
    # (the inverse cloze task: a sentence is closer to a claim or a question than a title is).
    pairs: Literal["title", "sentence"] = "title"
    # Which chunk of a relevant document is the positive: the one the index ranks highest for the
    # query ("best": the chunk that holds the evidence, as served), or always the first.
    positive_chunk: Literal["best", "first"] = "best"
    force: bool = False  # publish even if the held-back queries did not improve
    progress: bool = True
    train: TrainOptions = field(default_factory=TrainOptions)

    @property
    def labelled(self) -> bool:
        return self.queries is not None


@dataclass
class TuneReport:
    method: str = ""
    examples: int = 0
    fit_queries: int = 0
    train_seconds: float = 0.0
    reembed_seconds: float = 0.0
    seconds: float = 0.0
    weight_before: float = DEFAULT_DENSE_WEIGHT
    weight_after: float = DEFAULT_DENSE_WEIGHT
    fit_before: float | None = None  # held-back TRAIN nDCG@10, untuned fused order
    fit_after: float | None = None  # the same queries, tuned model, fitted weight
    grid: dict[float, float] = field(default_factory=dict)
    published: bool = False
    version: int = 0
    folder: Path | None = None


@dataclass(frozen=True)
class _Labels:
    train: dict[str, str]
    fit: dict[str, str]
    qrels: Qrels


def _read_labels(job: TuneJob, index: HnswIndex) -> _Labels:
    assert job.queries is not None and job.qrels is not None
    queries, qrels = load_queries(job.queries), load_qrels(job.qrels)
    known = {c.doc_id for c in index.chunks}
    usable = [q for q in queries if any(d in known for d in qrels.get(q, {}))]
    if len(usable) < 4:
        raise TuneInputError(
            f"only {len(usable)} queries have a judged document in this index (need 4 or more): "
            "do the qrels' corpus ids match the indexed documents' ids?"
        )
    train_ids, fit_ids = hash_split(usable, job.fit_fraction, FIT_SALT)
    return _Labels({q: queries[q] for q in train_ids}, {q: queries[q] for q in fit_ids}, qrels)


def _corpus_pairs(
    index: HnswIndex, max_pairs: int, seed: int, kind: str
) -> tuple[dict[str, str], Qrels, dict[str, str]]:
    """Label-free: each sampled document gives a query whose one relevant document is itself, and
    the positive text to learn for it (queries, qrels, positives)."""
    first = _first_chunks(index)
    rng = np.random.default_rng(seed)
    if kind == "sentence":
        usable = {d: split_sentences(c.text) for d, c in first.items()}
        usable = {d: [x for x in sents if len(x.split()) >= 6] for d, sents in usable.items() if len(sents) >= 3}
        docs = sorted(d for d, sents in usable.items() if sents)
    else:
        docs = sorted(d for d, c in first.items() if len(c.title.split()) >= 3 and len(c.text.split()) >= 20)
    if len(docs) < 4:
        raise TuneInputError(f"too few documents with a {kind} and a body to tune without labels (need 4)")
    picked = sorted(rng.choice(len(docs), size=min(max_pairs, len(docs)), replace=False))
    queries: dict[str, str] = {}
    positives: dict[str, str] = {}
    for i in picked:
        doc = docs[int(i)]
        chunk = first[doc]
        if kind == "sentence":
            sentence = usable[doc][int(rng.integers(len(usable[doc])))]
            queries[doc] = sentence
            positives[doc] = embedding_text(replace(chunk, text=chunk.text.replace(sentence, " ").strip()))
        else:
            queries[doc] = chunk.title
            positives[doc] = chunk.text  # the body alone: the title is the query
    return queries, {d: {d: 1} for d in queries}, positives


def _first_chunks(index: HnswIndex) -> dict[str, Chunk]:
    first: dict[str, Chunk] = {}
    for chunk in index.chunks:
        first.setdefault(chunk.doc_id, chunk)
    return first


def mine_examples(
    lists: CandidateLists,
    queries: dict[str, str],
    qrels: Qrels,
    positives: dict[str, str],
    weight: float,
    hard_negatives: int,
    best_chunk: Callable[[Chunk], str] | None = None,
) -> list[Example]:
    """(query, positive text, the top fused chunks of other documents) for every judged pair;
    `positives`: doc id -> the text to learn as relevant. With `best_chunk`, a relevant document
    found in the query's fused list is learnt from its highest-ranked chunk (as that function
    renders it) instead: a claim's evidence is often not in an abstract's first chunk."""
    examples = []
    for qid, text in queries.items():
        relevant = qrels.get(qid, {})
        negatives: list[str] = []
        seen: set[str] = set()
        found: dict[str, str] = {}
        for hit in weighted(lists.dense[qid], lists.lexical.get(qid, []), weight):
            doc = hit.chunk.doc_id
            if doc in relevant:
                if best_chunk is not None:
                    found.setdefault(doc, best_chunk(hit.chunk))
            elif doc not in seen and len(negatives) < hard_negatives:
                seen.add(doc)
                negatives.append(embedding_text(hit.chunk))
        examples += [Example(text, found.get(d, positives[d]), tuple(negatives)) for d in relevant if d in positives]
    return examples


def _fingerprint(index: HnswIndex, base: str, examples: list[Example], opts: TrainOptions) -> str:
    digest = hashlib.sha256(f"{index.identity}|{base}|{json.dumps(asdict(opts), sort_keys=True)}".encode())
    for ex in examples:
        digest.update(json.dumps([ex.anchor, ex.positive, list(ex.negatives)]).encode())
    return digest.hexdigest()


def _build_examples(
    job: TuneJob, index: HnswIndex, embedder: Embedder, weight: float
) -> tuple[list[Example], _Labels | None]:
    if job.labelled:
        labels = _read_labels(job, index)
        first = _first_chunks(index)
        positives = {d: embedding_text(c) for d, c in first.items()}
        lists = search_candidates(index, embedder, labels.train)
        best = embedding_text if job.positive_chunk == "best" else None
        examples = mine_examples(lists, labels.train, labels.qrels, positives, weight, job.hard_negatives, best)
        return examples, labels
    queries, qrels, positives = _corpus_pairs(index, job.max_pairs, job.train.seed, job.pairs)
    lists = search_candidates(index, embedder, queries)
    return mine_examples(lists, queries, qrels, positives, weight, job.hard_negatives), None


def run_tune(job: TuneJob, say: Callable[[str], None] = print) -> TuneReport:
    """Tune, re-embed, fit, publish (or not: see TuneReport.published). Holds the index root lock."""
    with index_root_lock(job.root):
        return _tune_locked(job, say)


def _tune_locked(job: TuneJob, say: Callable[[str], None]) -> TuneReport:
    started = time.perf_counter()
    report = TuneReport(method="labels" if job.labelled else "corpus")
    current = HnswIndex.load(job.root)
    base = str(current.manifest.tuned_embedder.get("base") or current.embedder_id)
    embedder = load_tuned_embedder(current.folder, current.manifest, threads=0) or _base_embedder(base)
    fitted = fitted_weight(current.folder, current.manifest)
    report.weight_before = fitted if fitted is not None else DEFAULT_DENSE_WEIGHT
    examples, labels = _build_examples(job, current, embedder, report.weight_before)
    report.examples = len(examples)
    say(f"{len(examples)} training examples ({report.method}), up to {job.hard_negatives} hard negatives each")
    work = job.work or job.root / ".tune"
    t0 = time.perf_counter()
    model_dir = train(
        resolve_embedder_path(base), examples, job.train, work, _fingerprint(current, base, examples, job.train),
        job.progress,
    )  # fmt: skip
    report.train_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    build, manifest = build_tuned_version(
        job.root, current, model_dir, base, job.train.max_seq_length, progress=job.progress
    )
    report.reembed_seconds = time.perf_counter() - t0
    tuned = serve_version(HnswIndex.load(build), embedder)
    if labels is not None:
        _fit(report, current, embedder, tuned, labels)
    if labels is not None and not job.force and (report.fit_after or 0.0) <= (report.fit_before or 0.0):
        shutil.rmtree(build, ignore_errors=True)
        say(
            "not published: the tuned model did not beat the untuned fused order on the held-back queries "
            f"(the trained model stays in {work}: run again with --force to publish it without retraining)"
        )
    else:
        version = latest_version(job.root) + 1
        final = replace(manifest, version=version, tuning=_tuning_record(report, job))
        report.folder = publish(job.root, build, final)
        serve_version(HnswIndex.load(job.root), embedder)  # verify what was published the way the server loads it
        report.published, report.version = True, version
        shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


def _base_embedder(base: str) -> Embedder:
    from ragserve.factory import make_embedder

    return make_embedder(EmbedderSettings(model=base, threads=0), indexing=True)


def _fit(report: TuneReport, current: HnswIndex, embedder: Embedder, tuned: ServingVersion, labels: _Labels) -> None:
    """Untuned (served weight) vs tuned (weight refitted) on the held-back TRAIN queries."""
    before = search_candidates(current, embedder, labels.fit)
    report.fit_before = score_runs(before.fused_documents(report.weight_before), labels.qrels).ndcg10
    after = search_candidates(tuned.index, tuned.embedder, labels.fit)
    report.weight_after, report.grid = fit_dense_weight(after, labels.qrels)
    report.fit_after = report.grid[report.weight_after]
    report.fit_queries = len(labels.fit)


def _tuning_record(report: TuneReport, job: TuneJob) -> dict[str, Any]:
    record: dict[str, Any] = {
        "method": report.method if job.labelled else f"{report.method}:{job.pairs}",
        "examples": report.examples,
        "hard_negatives": job.hard_negatives,
        "positive_chunk": job.positive_chunk,
        "epochs": job.train.epochs,
        "batch_size": job.train.batch_size,
        "lr": job.train.lr,
        "train_seconds": round(report.train_seconds, 1),
        "reembed_seconds": round(report.reembed_seconds, 1),
    }
    if report.fit_after is not None:
        record.update(
            fusion_dense_weight=report.weight_after,
            fit_queries=report.fit_queries,
            fit_ndcg10_untuned=round(report.fit_before or 0.0, 4),
            fit_ndcg10_tuned=round(report.fit_after, 4),
        )
    return record
