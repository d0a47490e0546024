"""Retrieval quality (nDCG@10, recall@100) through the running service's Retrieve API, on a BEIR dataset.

For each retrieval mode a real server is started as a subprocess (`ragserve serve`, retrieval only,
RAGSERVE_RETRIEVAL_MODE / RAGSERVE_FUSION set for it) on the given published index, and every
query goes over gRPC with dedupe_documents=true and top_k=100.

    python benchmarks/bench_quality.py --data ../shared/data/scifact --index IDX_ROOT \
        --modes dense,bm25,rrf,weighted --tune-weight

--tune-weight picks the weighted-fusion dense weight offline on half the queries (every other
query id, in-process, same index and fusion code) and reports the gRPC results on all queries and
on the held-out half, so the tuned number is not only measured on the data it was tuned on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.workloads import Server, evaluate, load_qrels, load_queries


def tuning_split(ids: list[str]) -> tuple[list[str], list[str]]:
    """Every other query (sorted by id) tunes, the rest is held out."""
    ordered = sorted(ids, key=lambda q: (len(q), q))
    return ordered[0::2], ordered[1::2]


# --- the service --------------------------------------------------------------------------------


MODES = {
    "dense": {"RAGSERVE_RETRIEVAL_MODE": "dense"},
    "bm25": {"RAGSERVE_RETRIEVAL_MODE": "bm25"},
    "rrf": {"RAGSERVE_RETRIEVAL_MODE": "hybrid", "RAGSERVE_FUSION": "rrf"},
    "weighted": {"RAGSERVE_RETRIEVAL_MODE": "hybrid", "RAGSERVE_FUSION": "weighted"},
}


async def retrieve_all(target: str, queries: dict[str, str], top_k: int, concurrency: int) -> dict[str, list[str]]:
    import grpc

    from ragserve.v1 import rag_pb2 as pb
    from ragserve.v1 import rag_pb2_grpc as pb_grpc

    runs: dict[str, list[str]] = {}
    sem = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RagServiceStub(channel)

        async def one(qid: str, text: str) -> None:
            async with sem:
                reply = await stub.Retrieve(
                    pb.RetrieveRequest(query=text[:2000], top_k=top_k, dedupe_documents=True), timeout=60
                )
            runs[qid] = [p.doc_id for p in reply.passages]

        await asyncio.gather(*(one(q, t) for q, t in queries.items()))
    return runs


def tune_weight(index_root: Path, queries: dict[str, str], qrels: dict[str, dict[str, int]], backend: str) -> float:
    """Grid-search the dense weight in-process on the tuning half (same index and fusion code)."""
    from ragserve.config import EmbedderSettings
    from ragserve.factory import make_embedder
    from ragserve.index.fusion import RetrievalOptions, hybrid_search, plan_breadth
    from ragserve.index.hnsw import HnswIndex

    tune_ids, _ = tuning_split(list(qrels))
    index = HnswIndex.load(index_root)
    embedder = make_embedder(EmbedderSettings(backend=backend))  # type: ignore[arg-type]
    ids = [q for q in tune_ids if q in queries]
    vectors = embedder.embed_queries([queries[q] for q in ids])
    best = (-1.0, 0.5)
    for w in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]:
        opts = RetrievalOptions(mode="hybrid", fusion="weighted", dense_weight=w)
        runs = {}
        for q, vec in zip(ids, vectors, strict=True):
            breadth = plan_breadth(opts, "hybrid", 100, 100, dedupe=True)
            hits = hybrid_search(index, queries[q], vec, breadth, opts, "hybrid", dedupe=True)
            runs[q] = [h.chunk.doc_id for h in hits]
        score = evaluate(runs, qrels, ids)["ndcg@10"]
        print(f"  tune weighted w_dense={w:.1f}: nDCG@10 {score:.4f} on {len(ids)} tuning queries", flush=True)
        best = max(best, (score, w))
    return best[1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels")
    ap.add_argument("--index", type=Path, required=True, help="published index root built from the corpus")
    ap.add_argument("--modes", default="dense,bm25,rrf,weighted")
    ap.add_argument("--dense-weight", type=float, default=0.5)
    ap.add_argument("--tune-weight", action="store_true")
    ap.add_argument("--embedder-backend", default="onnx", choices=["torch", "onnx"], help="the server's (default onnx)")
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--limit", type=int, default=0, help="only the first N queries (smoke runs)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    queries = load_queries(args.data)
    qrels = load_qrels(args.data)
    queries = {q: t for q, t in queries.items() if q in qrels}
    if args.limit:
        queries = dict(list(queries.items())[: args.limit])
    _, held_out = tuning_split(list(qrels))
    weight = args.dense_weight
    if args.tune_weight and "weighted" in args.modes:
        weight = tune_weight(args.index, queries, qrels, args.embedder_backend)
        print(f"chosen dense weight {weight:.1f} (tuned on the other half)", flush=True)

    results = {}
    for mode in args.modes.split(","):
        env = dict(MODES[mode], RAGSERVE_EMBEDDER_BACKEND=args.embedder_backend)
        if mode == "weighted":
            env["RAGSERVE_FUSION_DENSE_WEIGHT"] = str(weight)
        server = Server(args.index, env, Path(f"/tmp/bench_quality_{mode}.log"))
        try:
            await server.wait_ready()
            started = time.perf_counter()
            runs = await retrieve_all(server.target, queries, args.top_k, args.concurrency)
            seconds = time.perf_counter() - started
        finally:
            server.stop()
        all_q = evaluate(runs, qrels, queries)
        held = evaluate(runs, qrels, [q for q in held_out if q in queries])
        name = f"{mode}(w={weight:.1f})" if mode == "weighted" else mode
        results[name] = {"all": all_q, "held_out": held, "seconds": seconds}
        print(
            f"{name:16s} nDCG@10 {all_q['ndcg@10']:.4f}  recall@100 {all_q['recall@100']:.4f}  "
            f"(held-out half: nDCG@10 {held['ndcg@10']:.4f}, recall@100 {held['recall@100']:.4f})  "
            f"{int(all_q['queries'])} queries over gRPC in {seconds:.1f} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
