"""What freezing the start-up heap buys (ragserve/heap.py): full collections, and the requests
that wait behind them, with RAGSERVE_FREEZE_START_UP_HEAP on and off.

    python benchmarks/bench_heap.py --index INDEX_ROOT --data ../shared/data/scifact [--rounds 2]

Each round starts two retrieval-only servers in turn (hybrid, no reranker, no cache, the same
settings as bench_scale), freezing on and then off. Each sends the data set's queries once,
unrecorded, then --requests more, cycled (Retrieve top_k 10, one at a time): p50 / p99 / p99.9 /
max in ms, and the full (generation 2) collections the server ran meanwhile, from its own /metrics
(prometheus_client's python_gc_collections_total).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_scale import SERVER_ENV  # noqa: E402
from benchmarks.harness import free_port, index_parser, load_avg, percentile, start_client  # noqa: E402
from benchmarks.workloads import Server, load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402


def full_collections(metrics_port: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "python_gc_collections_total" and sample.labels.get("generation") == "2"
    )


async def serve_once(root: Path, queries: list[str], requests: int, freeze: bool) -> dict[str, Any]:
    metrics_port = free_port()
    env = {
        **SERVER_ENV,
        "RAGSERVE_FREEZE_START_UP_HEAP": str(freeze).lower(),
        "RAGSERVE_METRICS_PORT": str(metrics_port),
    }
    server = Server(root, env, Path(tempfile.gettempdir()) / f"bench-heap-{freeze}.log")
    try:
        await server.wait_ready(900)
        times = []
        async with RagClient(server.target, default_timeout_s=30) as client:
            for query in queries:
                await client.retrieve(query, top_k=10)
            before = full_collections(metrics_port)
            for n in range(requests):
                started = time.perf_counter()
                await client.retrieve(queries[n % len(queries)], top_k=10)
                times.append((time.perf_counter() - started) * 1000)
            collections = full_collections(metrics_port) - before
    finally:
        server.stop()
    return {
        "freeze": freeze,
        "p50 ms": round(percentile(times, 50), 1),
        "p99 ms": round(percentile(times, 99), 1),
        "p99.9 ms": round(percentile(times, 99.9), 1),
        "max ms": round(max(times), 1),
        "full collections": collections,
    }


def main() -> None:
    parser = index_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    queries = list(load_queries(args.data).values())[:300]
    start_client()
    for round_no in range(1, args.rounds + 1):
        for freeze in (True, False):
            row = asyncio.run(serve_once(args.index, queries, args.requests, freeze))
            print(json.dumps({"round": round_no, **row}), flush=True)
    print(f"load at end {load_avg()}")


if __name__ == "__main__":
    main()
