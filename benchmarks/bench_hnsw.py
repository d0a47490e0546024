"""HNSW settings by measurement: recall@10 against exact (brute-force numpy) search, and latency.

1. On a published index's chunk vectors (e.g. SciFact) with real query embeddings:

    python benchmarks/bench_hnsw.py chunks --index IDX_ROOT --data ../shared/data/scifact

2. On synthetic 384-d unit vectors (a Gaussian mixture: clustered like real embeddings, not
   uniform noise) at a given size, for the chosen settings:

    python benchmarks/bench_hnsw.py synthetic --n 1000000 --m 32 --ef-construction 200 --ef 64,128

Recall@10 = |HNSW top 10 ∩ exact top 10| / 10, averaged over queries; latency is one query per
knn_query call (what the server does), p50/p95/p99 in ms, single-threaded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import hnswlib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workloads import load_qrels, load_queries


def exact_top(data: np.ndarray, queries: np.ndarray, k: int, block: int = 256) -> np.ndarray:
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), block):
        scores = queries[start : start + block] @ data.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        out[start : start + block] = np.take_along_axis(top, order, axis=1)
    return out


def build(data: np.ndarray, m: int, ef_construction: int, threads: int) -> tuple[hnswlib.Index, float]:
    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=m, ef_construction=ef_construction, random_seed=100)
    index.set_num_threads(threads)
    started = time.perf_counter()
    index.add_items(data, np.arange(len(data)))
    return index, time.perf_counter() - started


def measure(index: hnswlib.Index, queries: np.ndarray, truth: np.ndarray, ef: int, k: int = 10) -> dict[str, float]:
    index.set_ef(max(ef, k))
    index.set_num_threads(1)
    found = np.empty((len(queries), k), dtype=np.int64)
    lat = []
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        labels, _ = index.knn_query(q.reshape(1, -1), k=k)
        lat.append((time.perf_counter() - t0) * 1000.0)
        found[i] = labels[0]
    recall = np.mean([len(set(found[i]) & set(truth[i, :k])) / k for i in range(len(queries))])
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return {"recall@10": float(recall), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def chunks_mode(args: argparse.Namespace) -> None:
    from ragserve.embed.torch_backend import SentenceTransformerEmbedder
    from ragserve.index.format import VECTORS_FILE, resolve_current

    data = np.load(resolve_current(args.index) / VECTORS_FILE).astype(np.float32)
    qrels = load_qrels(args.data)
    texts = [t for q, t in load_queries(args.data).items() if q in qrels]
    queries = SentenceTransformerEmbedder().embed_queries(texts)
    truth = exact_top(data, queries, 10)
    print(f"{len(data)} chunk vectors ({data.shape[1]} dims), {len(queries)} real queries; exact top-10 as truth")
    for m in (int(x) for x in args.m.split(",")):
        for efc in (int(x) for x in args.ef_construction.split(",")):
            index, secs = build(data, m, efc, args.threads)
            for ef in (int(x) for x in args.ef.split(",")):
                r = measure(index, queries, truth, ef)
                print(
                    f"M={m:3d} ef_construction={efc:4d} build {secs:6.1f} s | ef_search={ef:4d}: "
                    f"recall@10 {r['recall@10']:.4f}  p50 {r['p50']:.3f} ms  p95 {r['p95']:.3f} ms  "
                    f"p99 {r['p99']:.3f} ms",
                    flush=True,
                )


def synthetic(n: int, dim: int, centers: int, seed: int, noise: float = 0.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mids = rng.standard_normal((centers, dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        size = min(100_000, n - start)
        assign = rng.integers(0, centers, size)
        out[start : start + size] = mids[assign] + noise * rng.standard_normal((size, dim)).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def synthetic_mode(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    data = synthetic(args.n + args.queries, args.dim, args.centers, seed=7, noise=args.noise)
    queries, data = data[: args.queries], data[args.queries :]
    truth = exact_top(data, queries, 10)
    print(
        f"synthetic: {len(data)} vectors x {args.dim} dims (mixture of {args.centers} Gaussians, "
        f"noise {args.noise} per dim, unit norm), "
        f"{len(queries)} held-out queries; data + exact truth in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    index, secs = build(data, args.m_one, args.ef_construction_one, args.threads)
    print(
        f"built M={args.m_one} ef_construction={args.ef_construction_one} with {args.threads} threads in {secs:.1f} s",
        flush=True,
    )
    for ef in (int(x) for x in args.ef.split(",")):
        r = measure(index, queries, truth, ef)
        print(
            f"  ef_search={ef:4d}: recall@10 {r['recall@10']:.4f}  p50 {r['p50']:.3f} ms  p95 {r['p95']:.3f} ms  "
            f"p99 {r['p99']:.3f} ms",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("chunks")
    c.add_argument("--index", type=Path, required=True)
    c.add_argument("--data", type=Path, required=True)
    c.add_argument("--m", default="16,32")
    c.add_argument("--ef-construction", default="100,200")
    c.add_argument("--ef", default="16,32,64,128")
    c.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("synthetic")
    s.add_argument("--n", type=int, default=1_000_000)
    s.add_argument("--dim", type=int, default=384)
    s.add_argument("--centers", type=int, default=2000)
    s.add_argument("--queries", type=int, default=1000)
    # Per-dimension noise around unit-variance centres: 0.6 keeps clusters apart, 1.5+ blurs them.
    s.add_argument("--noise", type=float, default=0.6)
    s.add_argument("--m", dest="m_one", type=int, default=32)
    s.add_argument("--ef-construction", dest="ef_construction_one", type=int, default=200)
    s.add_argument("--ef", default="64,128")
    s.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    chunks_mode(args) if args.mode == "chunks" else synthetic_mode(args)


if __name__ == "__main__":
    main()
