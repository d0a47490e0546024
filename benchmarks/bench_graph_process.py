"""What moving a version's HNSW graph into a helper process costs and buys, one run, one index.

    python benchmarks/bench_graph_process.py --index INDEX_ROOT [--queries 500] [--ef 0]
    python benchmarks/bench_graph_process.py --index INDEX_ROOT --serve 2 --data ../shared/data/scifact

For the graph in this process and in a helper process (ragserve/index/graph_process.py), in turn:
- load: seconds for `HnswIndex.load` (checksums included; every file read once before, so both
  find it in the page cache), and the longest stall a 1 ms ticker
  thread saw meanwhile: how long a request in the serving process would wait behind the load;
- search: dense search p50/p99 of the same queries at the version's measured ef (or --ef), each
  one search as a request makes it, top 10; queries are stored vectors moved halfway to another
  (away from any one, as questions are).

`--serve N`: instead, N rounds of two retrieval-only servers (hybrid, no reranker, no cache), the
graph in a helper process and then in process (RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS), each:
seconds to SERVING, then SciFact's first 300 queries once unrecorded and once timed (Retrieve top_k
10, one at a time): p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, load_avg, percentile  # noqa: E402
from ragserve.index.graph import open_in_process  # noqa: E402
from ragserve.index.graph_process import GraphProcess  # noqa: E402
from ragserve.index.hnsw import GraphOpener, HnswIndex  # noqa: E402


class Ticker:
    """A thread that wakes every millisecond and keeps the longest gap between two wake-ups."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.longest * 1000


def probes(index: HnswIndex, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, index.count, size=(count, 2))
    vectors = index._graph.items(rows[:, 0]) + index._graph.items(rows[:, 1])
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def measure(root: Path, opener: GraphOpener, queries: np.ndarray | None, ef: int, count: int) -> dict[str, Any]:
    time.sleep(0.2)
    ticker = Ticker()
    started = time.perf_counter()
    index = HnswIndex.load(root, open_graph=opener)
    load_s = time.perf_counter() - started
    stall_ms = ticker.stop()
    if queries is None:
        queries = probes(index, count)
    ef = ef or int(index.manifest.hnsw.get("ef_search", 64))
    times = []
    for query in queries:
        started = time.perf_counter()
        index.search(query, 10, ef)
        times.append((time.perf_counter() - started) * 1000)
    index._graph.close()
    out = {"load s": round(load_s, 2), "longest stall during load ms": round(stall_ms, 1), "ef": ef}
    out |= {"search p50 ms": round(percentile(times, 50), 3), "search p99 ms": round(percentile(times, 99), 3)}
    return out | {"queries": queries}


async def serve_once(root: Path, data: Path, in_process: bool) -> dict[str, Any]:
    from benchmarks.bench_scale import SERVER_ENV
    from benchmarks.workloads import Server, load_queries
    from ragserve.client import RagClient

    threshold = "1000000000" if in_process else "0"
    env = {**SERVER_ENV, "RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS": threshold, "RAGSERVE_LOG_LEVEL": "INFO"}
    server = Server(root, env, Path(tempfile.gettempdir()) / f"bench-graph-serve-{threshold}.log")
    started = time.perf_counter()
    await server.wait_ready(900)
    ready_s, queries, times = time.perf_counter() - started, list(load_queries(data).values())[:300], []
    async with RagClient(server.target, default_timeout_s=30) as client:
        for query in queries:
            await client.retrieve(query, top_k=10)
        for query in queries:
            started = time.perf_counter()
            await client.retrieve(query, top_k=10)
            times.append((time.perf_counter() - started) * 1000)
    server.stop()
    row = {"to SERVING s": round(ready_s, 1), "p50 ms": round(percentile(times, 50), 1)}
    return row | {"p99 ms": round(percentile(times, 99), 1), "max ms": round(max(times), 1), "load": load_avg()}


def read_once(root: Path) -> None:
    """Every file of the version read once first: both loads then find it in the page cache."""
    for path in sorted((root / "CURRENT").resolve().rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                while handle.read(1 << 24):
                    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--ef", type=int, default=0, help="0: the version's measured ef")
    parser.add_argument("--serve", type=int, default=0, help="rounds of the two servers instead")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    args = parser.parse_args()
    if args.serve:
        for _ in range(args.serve):
            for name, in_process in (("helper process", False), ("in process", True)):
                print(name, json.dumps(asyncio.run(serve_once(args.index, args.data, in_process))), flush=True)
        return
    # the openers as at start-up
    openers: dict[str, GraphOpener] = {"in process": open_in_process, "helper process": GraphProcess.open}
    read_once(args.index)
    queries = None
    results: dict[str, Any] = {"cpu": cpu_name(), "load before": load_avg()}
    for name, opener in openers.items():
        row = measure(args.index, opener, queries, args.ef, args.queries)
        queries = row.pop("queries")
        results[name] = row
        print(name, json.dumps(row), flush=True)
    results["load after"] = load_avg()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
