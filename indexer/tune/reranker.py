"""`indexer tune-reranker`: a cross-encoder for the corpus an index serves, published with the version.

Labels only (BEIR queries.jsonl + qrels): the held-back part of the queries (the same split as
`indexer tune`) fits the blend weight and decides `beats_fused`; the rest become groups of one
relevant chunk and hard negatives from the version's own fused order, all in the chunk text the
server scores. The model is exported ONNX int8 into `reranker/`, scored on the held-back queries
at depths 5, 10 and 20 exactly as the server blends (ragserve/rerank/blend.py), and a new version
that ships it is published (the rest of the version is carried over unchanged).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from indexer.root_lock import index_root_lock
from indexer.tune.evaluation import (
    DEFAULT_DENSE_WEIGHT,
    FIT_SALT,
    CandidateLists,
    Qrels,
    TuneInputError,
    hash_split,
    load_qrels,
    load_queries,
    ndcg_at,
    search_candidates,
)
from indexer.tune.reranker_model import RerankGroup, RerankTrainOptions, segment_match_model, train_cross_encoder
from ragserve.config import RerankSettings, default_of
from ragserve.digests import sha256_file
from ragserve.embed.base import Embedder, resolve_embedder_path
from ragserve.factory import load_tuned_embedder, load_tuned_reranker, serve_version
from ragserve.index.format import MANIFEST, latest_version, new_build_dir, publish
from ragserve.index.fusion import dedupe_documents, weighted
from ragserve.index.hnsw import HnswIndex
from ragserve.index.shipped import fitted_weight
from ragserve.onnx_export import export_bert, quantize_int8
from ragserve.rerank.blend import blended_order
from ragserve.rerank.tuned import TUNED_DIR as TUNED_RERANKER_DIR
from ragserve.rerank.tuned import TUNED_ONNX as TUNED_RERANKER_ONNX
from ragserve.types import Chunk

# The weight is fitted over these depths, shallow ones included: the budget often leaves tier 1
# only a few pairs, and there the blend must not do worse than the fused order.
FIT_DEPTHS = (2, 3, 5, 10, 20)
DEPTHS = (5, 10, 20)  # reported
# Weights of the raw logit against fused scores in 0..1 (blend.py).
CE_WEIGHTS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_CANDIDATES: int = default_of(RerankSettings, "candidates")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@dataclass(frozen=True)
class RerankTuneJob:
    root: Path
    queries: Path
    qrels: Path
    base: str = "sentence-transformers/all-MiniLM-L6-v2"  # weights the cross-encoder starts from
    negatives: int = 7
    fit_fraction: float = 0.2
    # Held-back nDCG@10 gain (mean over FIT_DEPTHS) a reranker must show to be on by default: it
    # costs most of the retrieval budget, half a point of nDCG@10 is the least that pays for it.
    min_gain: float = 0.005
    work: Path | None = None  # checkpoints (default: <root>/.tune-reranker); removed once published
    progress: bool = True
    train: RerankTrainOptions = field(default_factory=RerankTrainOptions)


@dataclass
class RerankTuneReport:
    groups: int = 0
    fit_queries: int = 0
    train_seconds: float = 0.0
    seconds: float = 0.0
    fused: float = 0.0  # held-back nDCG@10 of the fused order
    ce_weight: float = 0.0
    by_depth: dict[int, float] = field(default_factory=dict)  # at ce_weight
    mean_gain: float = 0.0  # over the fused order, mean over FIT_DEPTHS
    grid: dict[str, float] = field(default_factory=dict)  # "depth/weight" -> nDCG@10
    beats_fused: bool = False
    version: int = 0
    folder: Path | None = None


def _served_fused(lists: CandidateLists, qid: str, weight: float) -> list[tuple[Chunk, float]]:
    """The candidates the server hands the reranker: fused, one chunk per document."""
    fused = dedupe_documents(weighted(lists.dense[qid], lists.lexical.get(qid, []), weight))
    return [(hit.chunk, hit.score) for hit in fused[:_CANDIDATES]]


def mine_groups(
    index: HnswIndex,
    lists: CandidateLists,
    queries: dict[str, str],
    qrels: Qrels,
    weight: float,
    negatives: int,
    seed: int,
) -> list[RerankGroup]:
    """One group per (query, relevant document): its highest-ranked chunk (else its first), and
    `negatives` chunks of other documents sampled from the top of the fused order."""
    first: dict[str, Chunk] = {}
    for chunk in index.chunks:
        first.setdefault(chunk.doc_id, chunk)
    rng = np.random.default_rng(seed)
    groups = []
    for qid, text in sorted(queries.items()):
        relevant = qrels.get(qid, {})
        best: dict[str, str] = {}
        pool: list[str] = []
        for hit in weighted(lists.dense[qid], lists.lexical.get(qid, []), weight):
            doc = hit.chunk.doc_id
            if doc in relevant:
                best.setdefault(doc, hit.chunk.text)
            elif len(pool) < 3 * negatives and hit.chunk.text not in pool:
                pool.append(hit.chunk.text)
        if len(pool) < negatives:
            continue
        picked = tuple(pool[int(i)] for i in sorted(rng.choice(len(pool), size=negatives, replace=False)))
        for doc in relevant:
            positive = best.get(doc) or (first[doc].text if doc in first else None)
            if positive:
                groups.append(RerankGroup(text, positive, picked))
    return groups


def score_blends(
    score: Callable[[str, Sequence[str]], np.ndarray],
    lists: CandidateLists,
    queries: dict[str, str],
    qrels: Qrels,
    weight: float,
    depths: Sequence[int] = FIT_DEPTHS,
    ce_weights: Sequence[float] = CE_WEIGHTS,
) -> dict[tuple[int, float], float]:
    """Mean nDCG@10 of the blended order at every (depth, ce_weight); ce_weight 0 is the fused order."""
    totals = dict.fromkeys(((d, w) for d in depths for w in ce_weights), 0.0)
    deepest = max(depths)
    for qid, text in queries.items():
        candidates = _served_fused(lists, qid, weight)
        fused = [s for _, s in candidates]
        logits = score(text, [c.text for c, _ in candidates[:deepest]])
        for d in depths:
            for w in ce_weights:
                order = blended_order(logits[:d], fused, w)
                totals[(d, w)] += ndcg_at([candidates[i][0].doc_id for i in order], qrels[qid])
    return {key: total / max(1, len(queries)) for key, total in totals.items()}


def fit_ce_weight(grid: dict[tuple[int, float], float], depths: Sequence[int] = FIT_DEPTHS) -> float:
    """The weight whose worst gain over the fused order, across the depths a budget may leave, is
    largest (then the best mean, then the lower weight). The best mean alone overfits a few hundred
    held-back queries: on SciFact it chose a weight that lost at depths 2-5 on other queries."""
    weights = sorted({w for _, w in grid})

    def key(w: float) -> tuple[float, float, float]:
        gains = [grid[(d, w)] - grid[(d, 0.0)] for d in depths]
        return (min(gains), sum(gains) / len(gains), -w)

    return max(weights, key=key)


def export_reranker(model_dir: Path, target: Path) -> Path:
    """The trained model as ONNX int8 plus its config and tokenizer files in `target`."""
    target.mkdir(parents=True)
    net = segment_match_model(str(model_dir)).eval()
    with tempfile.TemporaryDirectory(prefix=".export-", dir=target.parent) as tmp:
        fp32 = Path(tmp) / "model.onnx"
        export_bert(net, fp32, "logits", {0: "batch"})
        quantize_int8(fp32, target / Path(TUNED_RERANKER_ONNX).name, per_channel=False)
    shutil.copyfile(model_dir / "config.json", target / "config.json")
    for name in _TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, target / name)
    return target / Path(TUNED_RERANKER_ONNX).name


def run_tune_reranker(job: RerankTuneJob, say: Callable[[str], None] = print) -> RerankTuneReport:
    """Train, export, fit, publish. Holds the index root lock."""
    with index_root_lock(job.root):
        return _tune_locked(job, say)


def _tune_locked(job: RerankTuneJob, say: Callable[[str], None]) -> RerankTuneReport:
    started = time.perf_counter()
    report = RerankTuneReport()
    current = HnswIndex.load(job.root)
    fitted = fitted_weight(current.folder, current.manifest)
    weight = fitted if fitted is not None else DEFAULT_DENSE_WEIGHT
    queries, qrels = load_queries(job.queries), load_qrels(job.qrels)
    known = {c.doc_id for c in current.chunks}
    usable = sorted(q for q in queries if any(d in known for d in qrels.get(q, {})))
    if len(usable) < 4:
        raise TuneInputError(f"only {len(usable)} queries have a judged document in this index (need 4 or more)")
    train_ids, fit_ids = hash_split(usable, job.fit_fraction, FIT_SALT)
    embedder = _query_embedder(current)
    train_q = {q: queries[q] for q in train_ids}
    groups = mine_groups(
        current, search_candidates(current, embedder, train_q), train_q, qrels, weight, job.negatives, job.train.seed
    )
    report.groups = len(groups)
    say(f"{len(groups)} training groups (1 relevant + {job.negatives} hard negatives), {len(fit_ids)} held back")
    work = job.work or job.root / ".tune-reranker"
    t0 = time.perf_counter()
    model_dir = train_cross_encoder(
        resolve_embedder_path(job.base), groups, job.train, work, _fingerprint(current, job, groups), job.progress
    )
    report.train_seconds = time.perf_counter() - t0
    build = new_build_dir(job.root)
    onnx = export_reranker(model_dir, build / TUNED_RERANKER_DIR)
    files = _carry_over(current, build)
    for path in sorted((build / TUNED_RERANKER_DIR).iterdir()):
        files[f"{TUNED_RERANKER_DIR}/{path.name}"] = sha256_file(path)
    spec: dict[str, Any] = {
        "dir": TUNED_RERANKER_DIR,
        "onnx": TUNED_RERANKER_ONNX,
        "base": job.base,
        "layers": job.train.layers,
        "max_seq_len": job.train.max_seq_len,
        "ce_weight": 0.0,
        "beats_fused": False,
    }
    manifest = replace(current.manifest, files=files, tuned_reranker=spec)
    (build / MANIFEST).write_text(manifest.to_json())
    tuned = load_tuned_reranker(build, manifest, threads=0)
    assert tuned is not None and onnx.is_file()
    fit_q = {q: queries[q] for q in fit_ids}
    fit_lists = search_candidates(current, embedder, fit_q)
    grid = score_blends(lambda q, texts: _score(tuned.encoder, q, texts), fit_lists, fit_q, qrels, weight)
    _record_fit(report, grid, len(fit_q), job.min_gain)
    spec.update(ce_weight=report.ce_weight, beats_fused=report.beats_fused)
    version = latest_version(job.root) + 1
    tuning = dict(current.manifest.tuning)
    tuning["reranker"] = _record(report, job)
    final = replace(manifest, version=version, tuned_reranker=spec, tuning=tuning)
    report.folder = publish(job.root, build, final)
    serve_version(HnswIndex.load(job.root), embedder)  # verify what was published the way the server loads it
    report.version = version
    shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


def _query_embedder(index: HnswIndex) -> Embedder:
    """What the server embeds this version's queries with: its tuned model, else the default
    query embedder for the model the version was built with."""
    from ragserve.config import EmbedderSettings
    from ragserve.factory import make_embedder

    tuned = load_tuned_embedder(index.folder, index.manifest, threads=0)
    return tuned or make_embedder(EmbedderSettings(model=index.embedder_id, threads=0))


def _score(encoder: Any, query: str, texts: Sequence[str]) -> np.ndarray:
    out = [encoder.score(encoder.encode(query, texts[i : i + 8])) for i in range(0, len(texts), 8)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def _record_fit(
    report: RerankTuneReport, grid: dict[tuple[int, float], float], fit_queries: int, min_gain: float
) -> None:
    report.fit_queries = fit_queries
    report.fused = grid[(FIT_DEPTHS[0], 0.0)]
    report.ce_weight = fit_ce_weight(grid)
    report.by_depth = {d: grid[(d, report.ce_weight)] for d in FIT_DEPTHS}
    report.grid = {f"{d}/{w}": round(v, 4) for (d, w), v in grid.items()}
    # On by default only where, on the held-back queries, it did better than the fused order at
    # every depth a budget may leave it, and by enough on average to be worth its milliseconds.
    gains = [v - report.fused for v in report.by_depth.values()]
    report.mean_gain = sum(gains) / len(gains)
    report.beats_fused = report.ce_weight > 0 and min(gains) > 0 and report.mean_gain >= min_gain


def _carry_over(current: HnswIndex, build: Path) -> dict[str, str]:
    """Every listed file of the serving version except an older tuned reranker."""
    kept: dict[str, str] = {}
    for name, digest in current.manifest.files.items():
        if name.startswith(f"{TUNED_RERANKER_DIR}/"):
            continue
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(current.folder / name, build / name)
        kept[name] = digest
    return kept


def _fingerprint(index: HnswIndex, job: RerankTuneJob, groups: list[RerankGroup]) -> str:
    digest = hashlib.sha256(f"{index.identity}|{job.base}|{json.dumps(asdict(job.train), sort_keys=True)}".encode())
    for g in groups:
        digest.update(json.dumps([g.query, g.positive, list(g.negatives)]).encode())
    return digest.hexdigest()


def _record(report: RerankTuneReport, job: RerankTuneJob) -> dict[str, Any]:
    return {
        "groups": report.groups,
        "negatives": job.negatives,
        "layers": job.train.layers,
        "epochs": job.train.epochs,
        "lr": job.train.lr,
        "head_lr": job.train.head_lr,
        "train_seconds": round(report.train_seconds, 1),
        "fit_queries": report.fit_queries,
        "fit_ndcg10_fused": round(report.fused, 4),
        "fit_ndcg10_by_depth": {str(d): round(v, 4) for d, v in report.by_depth.items()},
        "ce_weight": report.ce_weight,
        "fit_mean_gain": round(report.mean_gain, 4),
        "min_gain": job.min_gain,
        "beats_fused": report.beats_fused,
    }
