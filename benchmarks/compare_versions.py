"""Whether two index versions hold the same content, for a change to the builder: the docstore, the
document records and the vectors byte for byte; BM25 the same postings and scores for every stem
(its vocabulary's numbering may differ) and the same top 10 for the benchmark's queries; and each
graph's recall@10 against exact search over the same vectors (hnswlib inserts on several threads,
so two builds' graphs differ in their links, not in what they find).

    python benchmarks/compare_versions.py OLD_ROOT NEW_ROOT [--data ../shared/data/scifact]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name  # noqa: E402
from benchmarks.workloads import load_queries  # noqa: E402
from ragserve.index.bm25 import BM25_DIR, Bm25Index  # noqa: E402
from ragserve.index.format import CHUNKS_FILE, DOCUMENTS_FILE, HNSW_FILE, VECTORS_FILE, resolve_current  # noqa: E402
from ragserve.index.graph import load_graph  # noqa: E402
from ragserve.index.hnsw_build import exact_top  # noqa: E402
from ragserve.index.vector_file import VectorFile  # noqa: E402


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def bm25_digest(folder: Path) -> str:
    """One digest over every stem's postings and scores, stems in sorted order."""
    import bm25s

    loaded = bm25s.BM25.load(str(folder / BM25_DIR), load_corpus=False, mmap=True)
    data, indices, indptr = (loaded.scores[k] for k in ("data", "indices", "indptr"))
    digest = hashlib.sha256()
    for stem in sorted(loaded.vocab_dict):
        column = loaded.vocab_dict[stem]
        if column >= len(indptr) - 1:
            continue
        lo, hi = int(indptr[column]), int(indptr[column + 1])
        digest.update(stem.encode() + b"\0")
        digest.update(np.asarray(indices[lo:hi], dtype=np.int64).tobytes())
        digest.update(np.asarray(data[lo:hi], dtype=np.float32).tobytes())
    return digest.hexdigest()


def recall(folder: Path, queries: np.ndarray, efs: tuple[int, ...]) -> list[float]:
    with VectorFile(folder / VECTORS_FILE) as vectors:
        truth = exact_top(queries, vectors, 10)
        graph = load_graph(folder / HNSW_FILE, vectors.dim, len(vectors))
    out = []
    for ef in efs:
        hits = 0
        for query, best in zip(queries, truth, strict=True):
            labels, _ = graph.knn(query, 10, ef)
            hits += len(set(labels.tolist()) & set(best.tolist()))
        out.append(hits / (10 * len(queries)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    from indexer.cli import load_embedder
    from ragserve.config import EmbedderSettings, default_of

    texts = list(load_queries(args.data).values())[: args.queries]
    embedder: Any = load_embedder(default_of(EmbedderSettings, "model"), "onnx", "cpu", True)
    queries = np.asarray(embedder.embed_queries(texts), dtype=np.float32)
    folders = [resolve_current(args.old), resolve_current(args.new)]
    print(f"{cpu_name()}; {folders[0]} against {folders[1]}")
    for name in (CHUNKS_FILE, DOCUMENTS_FILE, VECTORS_FILE):
        same = file_digest(folders[0] / name) == file_digest(folders[1] / name)
        print(f"{name}: {'same bytes' if same else 'DIFFERENT'}")
    print(f"BM25 postings and scores: {'same' if bm25_digest(folders[0]) == bm25_digest(folders[1]) else 'DIFFERENT'}")
    count = int(np.load(folders[0] / VECTORS_FILE, mmap_mode="r").shape[0])
    lexical = [Bm25Index.load(folder, count) for folder in folders]
    tops = [[index.search(text, 10) for text in texts] for index in lexical]
    print(f"BM25 top 10 for {len(texts)} queries: {'same' if tops[0] == tops[1] else 'DIFFERENT'}")
    del lexical
    efs = (64, 128)
    found = [recall(folder, queries, efs) for folder in folders]
    for i, ef in enumerate(efs):
        print(f"recall@10 at ef {ef}: {found[0][i]:.4f} against {found[1][i]:.4f}")


if __name__ == "__main__":
    main()
