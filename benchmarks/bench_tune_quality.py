"""Tuning retrieval to the corpus: untuned fused order vs tuned variants on held-back DEV queries.

A deterministic split of the BEIR queries (salted sha256 of the query id): 25% are DEV and are
never given to the tuner; the rest are TRAIN (the tuner itself holds back part of TRAIN to fit the
fusion weight). Measured in-process with the project's own index, fusion and query-embedder code
(`indexer/tune/evaluation.py`: the same order as Retrieve with top_k=100, dedupe_documents=true, the
server's default ONNX int8 query embedder, or the tuned one a version ships).

    # 1. write the TRAIN queries/qrels the tuner may see (DEV left out)
    python benchmarks/bench_tune_quality.py split --data ../shared/data/scifact --out OUT
    # 2. tune (see README, "Tuning retrieval to the corpus"), timed here
    python benchmarks/bench_tune_quality.py tune --index ROOT --out OUT -- --epochs 1
    # 3. DEV nDCG@10 / recall@100 of a published version (what the server would serve: its own
    #    tuned query embedder and fitted weight, if it ships them)
    python benchmarks/bench_tune_quality.py eval --data ../shared/data/scifact --index ROOT --label untuned
    # 4. server-side Retrieve latency over gRPC (a real `ragserve serve`, retrieval only, cache off,
    #    the default 70 ms budget), DEV queries at concurrency 1 and 4
    python benchmarks/bench_tune_quality.py latency --data ../shared/data/scifact --index ROOT
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import cpu_name
from benchmarks.workloads import load_qrels, load_queries
from indexer.tune.evaluation import hash_split, score_runs, search_candidates
from ragserve.embed.base import Embedder
from ragserve.index.hnsw import HnswIndex

DEV_FRACTION = 0.25
DEV_SALT = "ragserve-bench-dev"


def dev_split(data: Path) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """(TRAIN queries, DEV queries, qrels), judged queries only."""
    queries = load_queries(data)
    qrels = load_qrels(data)
    judged = [q for q in queries if q in qrels]
    train, dev = hash_split(judged, DEV_FRACTION, DEV_SALT)
    return {q: queries[q] for q in train}, {q: queries[q] for q in dev}, qrels


def cmd_split(args: argparse.Namespace) -> None:
    train, dev, qrels = dev_split(args.data)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train_queries.jsonl").open("w") as handle:
        for qid, text in train.items():
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with (out / "train_qrels.tsv").open("w") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for qid in train:
            for doc, rel in qrels[qid].items():
                handle.write(f"{qid}\t{doc}\t{rel}\n")
    (out / "dev_ids.txt").write_text("\n".join(dev) + "\n")
    print(f"TRAIN {len(train)} queries -> {out}/train_queries.jsonl, train_qrels.tsv; DEV {len(dev)} held back")


def cmd_tune(args: argparse.Namespace) -> None:
    out: Path = args.out
    cmd = [
        sys.executable, "-m", "indexer", "tune-reranker" if args.reranker else "tune", "--index", str(args.index),
        "--queries", str(out / "train_queries.jsonl"), "--qrels", str(out / "train_qrels.tsv"), *args.extra,
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"tune command wall time: {time.perf_counter() - started:.1f} s on {cpu_name()}", flush=True)


def _query_embedder(index: HnswIndex) -> Embedder:
    """What the server embeds this version's queries with: its own tuned model, else the default."""
    from ragserve.config import EmbedderSettings
    from ragserve.factory import make_embedder, serve_version

    return serve_version(index, make_embedder(EmbedderSettings())).embedder


def cmd_eval(args: argparse.Namespace) -> None:
    from ragserve.index.shipped import fitted_weight

    _, dev, qrels = dev_split(args.data)
    index = HnswIndex.load(args.index)
    embedder = _query_embedder(index)
    fitted = fitted_weight(index.folder, index.manifest)  # what the server would use for this version
    weight = args.dense_weight if args.dense_weight is not None else (fitted if fitted is not None else 0.4)
    started = time.perf_counter()
    lists = search_candidates(index, embedder, dev)
    fused = score_runs(lists.fused_documents(weight), qrels)
    dense = score_runs(lists.dense_documents(), qrels)
    row = {
        "label": args.label,
        "index_version": index.version,
        "embedder": index.embedder_id,
        "dense_weight": weight,
        "dev_queries": fused.queries,
        "fused_ndcg10": round(fused.ndcg10, 4),
        "fused_recall100": round(fused.recall100, 4),
        "dense_ndcg10": round(dense.ndcg10, 4),
        "dense_recall100": round(dense.recall100, 4),
        "seconds": round(time.perf_counter() - started, 1),
        "cpu": cpu_name(),
        "measured": "in-process (indexer/tune/evaluation.py), Retrieve order top_k=100 dedupe_documents=true",
    }
    rows = [row, *_reranked_rows(index, lists, dev, qrels, weight, row)]
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.json:
        with args.json.open("a") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in rows)


def _reranked_rows(
    index: HnswIndex, lists: object, dev: dict[str, str], qrels: dict[str, dict[str, int]], weight: float, base: dict
) -> list[dict]:
    """With the version's tuned cross-encoder: DEV nDCG@10 at fixed depths 5/10/20, blended with
    the fused score at its fitted weight (and the cross-encoder alone), as the server orders them."""
    from indexer.tune.reranker import FIT_DEPTHS, score_blends
    from ragserve.factory import load_tuned_reranker

    tuned = load_tuned_reranker(index.folder, index.manifest, threads=0)
    if tuned is None:
        return []
    encoder = tuned.encoder

    def score(query: str, texts: list[str]) -> object:
        import numpy as np

        parts = [encoder.score(encoder.encode(query, texts[i : i + 8])) for i in range(0, len(texts), 8)]
        return np.concatenate(parts)

    started = time.perf_counter()
    dev_judged = {q: t for q, t in dev.items() if q in qrels}
    grid = score_blends(score, lists, dev_judged, qrels, weight, ce_weights=(0.0, tuned.ce_weight, 1.0))  # type: ignore[arg-type]
    seconds = round(time.perf_counter() - started, 1)
    rows = []
    for depth in FIT_DEPTHS:
        for ce_weight, how in ((tuned.ce_weight, "blended (fitted)"), (1.0, "cross-encoder alone")):
            rows.append(
                {
                    **base,
                    "label": f"{base['label']} + reranker depth {depth} {how}",
                    "reranker": tuned.model_id,
                    "ce_weight": ce_weight,
                    "depth": depth,
                    "fused_ndcg10": round(grid[(depth, ce_weight)], 4),
                    "beats_fused_on_fit": tuned.beats_fused,
                    "seconds": seconds,
                }
            )
    return rows


@dataclass
class _Served:
    server_ms: list[float] = field(default_factory=list)
    documents: dict[str, list[str]] = field(default_factory=dict)  # query id -> served order
    depths: list[int] = field(default_factory=list)  # pairs the reranker scored, per request


async def _timed_retrieves(target: str, queries: dict[str, str], concurrency: int) -> _Served:
    import asyncio

    import grpc

    from ragserve.v1 import rag_pb2 as pb
    from ragserve.v1 import rag_pb2_grpc as pb_grpc

    served = _Served()
    queue = list(queries.items())
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RagServiceStub(channel)

        async def worker() -> None:
            while queue:
                qid, text = queue.pop()
                reply = await stub.Retrieve(pb.RetrieveRequest(query=text, top_k=10, dedupe_documents=True), timeout=10)
                served.server_ms.append(reply.timings.retrieval_total_ms)
                served.documents[qid] = [p.doc_id for p in reply.passages]
                served.depths.append(sum(int(t.split(":")[1]) for t in reply.rerank_tiers))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return served


def cmd_latency(args: argparse.Namespace) -> None:
    import asyncio

    import numpy as np

    from benchmarks.workloads import Server

    _, dev, qrels = dev_split(args.data)
    # The default budget, not the 10 s Server sets for quality runs; any RAGSERVE_* override after it (--env).
    env = {"RAGSERVE_RETRIEVAL_BUDGET_MS": "70", **dict(kv.split("=", 1) for kv in args.env)}
    server = Server(args.index, env, Path(f"/tmp/bench_tune_latency_{args.label or 'index'}.log"))
    try:
        asyncio.run(server.wait_ready())
        asyncio.run(_timed_retrieves(server.target, dict(list(dev.items())[:20]), 1))  # warm-up
        for concurrency in (1, 4):
            served = asyncio.run(_timed_retrieves(server.target, dev, concurrency))
            ms = np.asarray(served.server_ms)
            row = {
                "label": args.label,
                "env": args.env,
                "concurrency": concurrency,
                "requests": int(ms.size),
                "server_p50_ms": round(float(np.percentile(ms, 50)), 1),
                "server_p95_ms": round(float(np.percentile(ms, 95)), 1),
                "server_p99_ms": round(float(np.percentile(ms, 99)), 1),
                "ndcg10_as_served": round(score_runs(served.documents, qrels).ndcg10, 4),
                "rerank_depth_mean": round(float(np.mean(served.depths)), 1),
                "rerank_depth_p10": int(np.percentile(served.depths, 10)),
                "cpu": cpu_name(),
            }
            print(json.dumps(row), flush=True)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="write the TRAIN queries and qrels (DEV left out)")
    sp.add_argument("--data", type=Path, required=True)
    sp.add_argument("--out", type=Path, required=True)
    tp = sub.add_parser("tune", help="run `python -m indexer tune` on the TRAIN files, timed")
    tp.add_argument("--index", type=Path, required=True)
    tp.add_argument("--out", type=Path, required=True, help="the folder `split` wrote")
    tp.add_argument("--reranker", action="store_true", help="run `indexer tune-reranker` instead")
    tp.add_argument("extra", nargs="*", help="more options for the tune command (after --)")
    ep = sub.add_parser("eval", help="DEV nDCG@10 / recall@100 of a published index")
    ep.add_argument("--data", type=Path, required=True)
    ep.add_argument("--index", type=Path, required=True)
    ep.add_argument("--label", default="")
    ep.add_argument("--dense-weight", type=float, default=None, help="default: the version's fitted weight, or 0.4")
    ep.add_argument("--json", type=Path, help="append the result row here")
    lp = sub.add_parser("latency", help="server-side Retrieve p50/p99 over gRPC at concurrency 1 and 4")
    lp.add_argument("--data", type=Path, required=True)
    lp.add_argument("--index", type=Path, required=True)
    lp.add_argument("--label", default="")
    lp.add_argument("--env", action="append", default=[], help="RAGSERVE_X=V for the server (repeatable)")
    args = ap.parse_args()
    {"split": cmd_split, "tune": cmd_tune, "eval": cmd_eval, "latency": cmd_latency}[args.cmd](args)


if __name__ == "__main__":
    main()
