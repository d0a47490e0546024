"""Indexing throughput and quality per embedding backend (torch fp32, ONNX fp32, ONNX int8), one run.

Each backend builds the whole corpus with the real indexer (load, chunk, embed, HNSW, BM25,
publish: a full, non-incremental build) into OUT/<backend>; then nDCG@10 / recall@100 of dense
retrieval are computed with exact (brute-force) search over that index's chunk vectors, documents
scored by their best chunk, queries embedded by the same backend.

    python benchmarks/bench_embed.py --data ../shared/data/scifact --out /tmp/scifact-idx

Dense quality of an index another command built (say `ragserve-index build` of two commits, for
their throughput; queries embedded by BACKEND here):

    python benchmarks/bench_embed.py --data ../shared/data/scifact --out /tmp/x --max-docs 1000 \
        --backends onnx-int8 --eval-index /tmp/idx-before,/tmp/idx-after

Chunk-size sweep (dense, BM25 and RRF quality per setting, exact search, no publish):

    python benchmarks/bench_embed.py --data ../shared/data/scifact --out /tmp/x \
        --backends onnx-int8 --chunk-sweep 128:32,200:40,256:0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import evaluate, load_qrels, load_queries
from indexer.build import build_index
from indexer.chunking import ChunkingConfig, chunk_document, embedding_text
from indexer.loaders import Document
from indexer.sources import iter_source
from ragserve.index.base import ScoredChunk
from ragserve.index.bm25 import Bm25Index
from ragserve.index.bm25_build import build_bm25
from ragserve.index.chunk_store import read_chunks
from ragserve.index.format import CHUNKS_FILE, VECTORS_FILE, resolve_current
from ragserve.index.fusion import rrf


def make(backend: str) -> Any:
    if backend == "torch":
        from ragserve.embed.torch_backend import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder()
    from ragserve.embed.onnx_backend import OnnxEmbedder

    return OnnxEmbedder(quantize=backend == "onnx-int8", threads=0, spin=True)


def doc_runs(matrix: np.ndarray, doc_ids: list[str], qvecs: np.ndarray, qids: list[str], k: int = 100):
    """Exact search: every chunk scored, each document by its best chunk."""
    runs = {}
    scores = qvecs @ matrix.T
    for qi, q in enumerate(qids):
        order = np.argsort(-scores[qi])
        seen: list[str] = []
        for row in order:
            d = doc_ids[row]
            if d not in seen:
                seen.append(d)
                if len(seen) == k:
                    break
        runs[q] = seen
    return runs


def ranked_chunks(matrix, chunks, qvec, k):
    scores = matrix @ qvec
    top = np.argsort(-scores)[:k]
    return [ScoredChunk(chunks[i], float(scores[i])) for i in top]


def dedupe(hits):
    seen: list[str] = []
    for h in hits:
        if h.chunk.doc_id not in seen:
            seen.append(h.chunk.doc_id)
    return seen[:100]


def sweep(args, queries, qrels, corpus: Path) -> None:
    backend = args.backends.split(",")[0]
    emb = make(backend)
    docs = [d for d in iter_source(corpus) if isinstance(d, Document)]
    qids = list(queries)
    qvecs = emb.embed_queries([queries[q] for q in qids])
    for spec in args.chunk_sweep.split(","):
        size, overlap = (int(x) for x in spec.split(":"))
        cfg = ChunkingConfig(size, overlap)
        chunks = [c for d in docs for c in chunk_document(d, emb.tokenizer, cfg)]
        t0 = time.perf_counter()
        matrix = emb.embed_documents([embedding_text(c) for c in chunks], 64)
        secs = time.perf_counter() - t0
        folder = args.out / f"sweep-{size}-{overlap}"
        folder.mkdir(parents=True, exist_ok=True)
        build_bm25([embedding_text(c) for c in chunks], folder)
        bm25 = Bm25Index.load(folder, len(chunks))
        dense_runs, bm_runs, rrf_runs = {}, {}, {}
        for qi, q in enumerate(qids):
            d = ranked_chunks(matrix, chunks, qvecs[qi], 300)
            b = [ScoredChunk(chunks[r], s) for r, s in bm25.search(queries[q], 300)]
            dense_runs[q], bm_runs[q], rrf_runs[q] = dedupe(d), dedupe(b), dedupe(rrf([d[:100], b[:100]], 60))
        line = f"chunk {size:4d}/{overlap:3d}: {len(chunks):6d} chunks, embed {secs:6.1f} s"
        for name, runs in (("dense", dense_runs), ("bm25", bm_runs), ("rrf", rrf_runs)):
            m = evaluate(runs, qrels, qids)
            line += f" | {name} nDCG@10 {m['ndcg@10']:.4f} R@100 {m['recall@100']:.4f}"
        print(line, flush=True)


def sub_corpus(corpus: Path, judged: set[str], extra: int, out: Path) -> Path:
    """Every judged document (so every query keeps all its relevant documents) plus `extra` others."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    target = out / "sub-corpus.jsonl"
    kept = 0
    with corpus.open() as src, target.open("w") as dst:
        for line in src:
            doc_id = str(json.loads(line)["_id"])
            if doc_id in judged or kept < extra:
                kept += doc_id not in judged
                dst.write(line)
    return target


def evaluate_roots(emb: Any, roots: list[Path], queries: dict[str, str], qrels: dict) -> None:
    qids = list(queries)
    qvecs = emb.embed_queries([queries[q] for q in qids])
    for root in roots:
        folder = resolve_current(root)
        chunks = read_chunks(folder / CHUNKS_FILE)
        matrix = np.load(folder / VECTORS_FILE)
        m = evaluate(doc_runs(matrix, [c.doc_id for c in chunks], qvecs, qids), qrels, qids)
        print(f"{root}: {len(chunks)} chunks | dense exact nDCG@10 {m['ndcg@10']:.4f} recall@100 {m['recall@100']:.4f}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="index roots are written to OUT/<backend>")
    ap.add_argument("--backends", default="torch,onnx-fp32,onnx-int8")
    ap.add_argument("--chunk-tokens", type=int, default=ChunkingConfig().size_tokens)
    ap.add_argument("--overlap-tokens", type=int, default=ChunkingConfig().overlap_tokens)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--chunk-sweep", default="", help="size:overlap,... (quality per chunking, no publish)")
    ap.add_argument(
        "--max-docs",
        type=int,
        default=0,
        help="a sub-corpus: every judged document plus the first N others (for a busy machine); 0 = all",
    )
    ap.add_argument("--eval-index", default="", help="root,...: only evaluate these indexes (dense, exact)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()

    queries = load_queries(args.data)
    qrels = load_qrels(args.data)
    queries = {q: t for q, t in queries.items() if q in qrels}
    corpus = args.data / "corpus.jsonl"
    if args.max_docs:
        corpus = sub_corpus(corpus, {d for rel in qrels.values() for d in rel}, args.max_docs, args.out)
    if args.chunk_sweep:
        sweep(args, queries, qrels, corpus)
        return
    if args.eval_index:
        evaluate_roots(make(args.backends.split(",")[0]), [Path(r) for r in args.eval_index.split(",")], queries, qrels)
        return

    rows = []
    for backend in args.backends.split(","):
        emb = make(backend)  # model load and ONNX export are set-up, not indexing: outside the timing
        root = args.out / backend
        report = build_index(
            corpus,
            root,
            emb,
            ChunkingConfig(args.chunk_tokens, args.overlap_tokens),
            args.batch_size,
            progress=False,
            incremental=False,
            embedder_backend=backend,
        )
        folder = resolve_current(root)
        chunks = read_chunks(folder / CHUNKS_FILE)
        matrix = np.load(folder / VECTORS_FILE)
        qids = list(queries)
        qvecs = emb.embed_queries([queries[q] for q in qids])
        m = evaluate(doc_runs(matrix, [c.doc_id for c in chunks], qvecs, qids), qrels, qids)
        rows.append((backend, report, m))
        print(
            f"{backend:10s} {report.documents} docs, {report.chunks} chunks: build {report.seconds:7.1f} s "
            f"({report.docs_per_second:6.1f} docs/s; embedding {report.embed_seconds:7.1f} s) | "
            f"dense exact nDCG@10 {m['ndcg@10']:.4f} recall@100 {m['recall@100']:.4f}",
            flush=True,
        )
        del emb
    base = rows[0]
    print(f"\nratios against {base[0]} (same run):")
    for backend, report, m in rows:
        print(
            f"  {backend:10s} throughput x{report.docs_per_second / base[1].docs_per_second:.2f}  "
            f"nDCG@10 delta {m['ndcg@10'] - base[2]['ndcg@10']:+.4f}"
        )


if __name__ == "__main__":
    main()
