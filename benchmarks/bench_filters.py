"""Filtered retrieval: recall@10 against exact filtered search, and Retrieve latency, by selectivity.

SciFact's corpus gets a synthetic integer field `bucket` (0..999, from a hash of the document id,
so its selectivity is known): filters `bucket < 500, 100, 10, 1` pass about 50%, 10%, 1% and 0.1%
of the chunks. Two measurements, each beside unfiltered in the same run:

1. Index level (the product's HnswIndex, in process), over SciFact's queries: recall@10 of the
   filtered dense search against an exact (numpy) search of the chunks that pass, as served (an
   exact scan below RAGSERVE_FILTER_EXACT_SCAN_MAX_CHUNKS) and with the filtered HNSW walk forced.
2. Server level: a retrieval-only `ragserve serve` on loopback, Retrieve (hybrid, no reranker)
   p50/p95/p99 in ms as the client sees it, per filter.

    python benchmarks/bench_filters.py --data ../shared/data/scifact --work /tmp/bench-filters
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import REPO, SERVER_DEFAULTS, load_avg, percentile, start_server, stop_server
from benchmarks.workloads import load_queries

SHARES = {"50%": 500, "10%": 100, "1%": 10, "0.1%": 1}


def bucket(doc_id: str) -> int:
    return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:4], "big") % 1000


def build(data: Path, work: Path) -> Path:
    corpus = work / "corpus.jsonl"
    with (data / "corpus.jsonl").open() as src, corpus.open("w") as out:
        for line in src:
            record = json.loads(line)
            record["metadata"] = {"bucket": bucket(str(record["_id"]))}
            out.write(json.dumps(record) + "\n")
    root = work / "index"
    if not (root / "CURRENT").exists():
        command = [str(Path(sys.executable).parent / "ragserve-index"), "build", str(corpus), "--out", str(root)]
        subprocess.run(
            [*command, "--backend", "onnx", "--no-progress", "--field", "bucket:integer"], check=True, cwd=REPO
        )
    return root


def filter_of(below: int | None) -> dict | None:
    return None if below is None else {"must": [{"key": "bucket", "range": {"lt": below}}]}


def index_level(root: Path, queries: list[str]) -> list[str]:
    from ragserve.embed.torch_backend import SentenceTransformerEmbedder
    from ragserve.filters import matches, parse_filter
    from ragserve.index.format import VECTORS_FILE, resolve_current
    from ragserve.index.hnsw import HnswIndex

    index = HnswIndex.load(root)
    vectors = np.load(resolve_current(root) / VECTORS_FILE)
    embedded = SentenceTransformerEmbedder().embed_queries(queries)
    lines = [
        "| filter | chunks passing | recall@10 as served | served p50 / p99 ms "
        "| recall@10, HNSW walk forced | walk p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, below in [("none", None), *SHARES.items()]:
        flt = parse_filter(filter_of(below), index.fields)
        # The truth from the filter's meaning over the docstore, not from the index's own masks.
        rows = np.asarray([i for i, c in enumerate(index.chunks) if matches(flt, c.metadata, index.fields)])
        cells = [name, f"{rows.size} ({rows.size / index.count:.2%})"]
        for forced in (False, True):
            index.exact_scan_max = 0 if forced else 20_000
            recalls, times = [], []
            for q in embedded:
                scores = vectors[rows] @ q
                truth = set(rows[np.argsort(-scores)[:10]].tolist())
                started = time.perf_counter()
                hits = index.search(q, 10, 64, flt)
                times.append((time.perf_counter() - started) * 1000.0)
                found = {_row(index, h.chunk.chunk_id) for h in hits}
                recalls.append(len(found & truth) / max(1, min(10, len(truth))))
            cells += [f"{np.mean(recalls):.3f}", f"{percentile(times, 50):.2f} / {percentile(times, 99):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


_ROWS: dict[str, int] = {}


def _row(index: object, chunk_id: str) -> int:
    if not _ROWS:
        _ROWS.update({c.chunk_id: i for i, c in enumerate(index.chunks)})  # type: ignore[attr-defined]
    return _ROWS[chunk_id]


async def server_level(target: str, queries: list[str], rounds: int) -> list[str]:
    from ragserve.client import RagClient

    lines = [
        "| filter | Retrieve p50 ms | p95 | p99 | passages per reply (mean) | p99 / unfiltered p99 |",
        "|---|---|---|---|---|---|",
    ]
    async with RagClient(target, default_timeout_s=30) as client:
        for q in queries[:20]:
            await client.retrieve(q, top_k=10)  # warm-up
        base_p99 = None
        for name, below in [("none", None), *SHARES.items()]:
            times, counts = [], []
            for _ in range(rounds):
                for q in queries:
                    started = time.perf_counter()
                    reply = await client.retrieve(q, top_k=10, filter=filter_of(below))
                    times.append((time.perf_counter() - started) * 1000.0)
                    counts.append(len(reply.passages))
            p99 = percentile(times, 99)
            base_p99 = base_p99 or p99
            lines.append(
                f"| {name} | {percentile(times, 50):.2f} | {percentile(times, 95):.2f} | {p99:.2f} | "
                f"{np.mean(counts):.1f} | {p99 / base_p99:.2f}x |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    root = build(args.data, args.work)
    queries = list(load_queries(args.data).values())[: args.queries]
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    print(f"host: {cpu}, load {load_avg()}; {len(queries)} SciFact queries, top_k 10\n")
    print("\n".join(index_level(root, queries)))
    env = {**SERVER_DEFAULTS, "RAGSERVE_GENERATION_ENABLED": "false", "RAGSERVE_RERANK_MODE": "off"}
    process, target = start_server(root, env, args.work / "server.log")
    try:
        print()
        print("\n".join(asyncio.run(server_level(target, queries, args.rounds))))
    finally:
        stop_server(process)


if __name__ == "__main__":
    main()
