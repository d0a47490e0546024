"""Retrieval cache benchmark over gRPC: miss vs in-process hit vs Redis hit, and a Zipf hit rate.

One run, one in-process gRPC server (the real servicer, real MiniLM embedder, real HNSW index over the
bundled sample corpus; no generator: Retrieve does not need it) and one real redis-server on a free
loopback port, started and stopped here. Between phases only the pipeline's cache is swapped.

Server-side latency is the response's `timings.retrieval_total_ms` (from the request's Deadline to the
end of retrieval); client-side latency is the Retrieve call as the client sees it.

    python benchmarks/bench_cache.py [--requests 200] [--zipf-requests 3000] [--zipf-s 1.1]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.workloads import RedisProcess, serve_pipeline  # noqa: E402
from indexer.build import build_index  # noqa: E402
from ragserve.cache.circuit import CircuitBreaker  # noqa: E402
from ragserve.cache.layer import StoreBackedCache  # noqa: E402
from ragserve.cache.memory import MemoryStore  # noqa: E402
from ragserve.cache.redis_cache import RedisStore  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.embed.torch_backend import SentenceTransformerEmbedder  # noqa: E402
from ragserve.factory import assemble_pipeline  # noqa: E402
from ragserve.index.hnsw import HnswIndex  # noqa: E402

SAMPLE_DOCS = REPO / "indexer" / "sample_docs"
TOP_K = 5


def corpus_queries() -> list[str]:
    """Distinct natural-language queries: the sample corpus's sentences (every miss is a real miss)."""
    seen: dict[str, None] = {}
    for path in sorted(SAMPLE_DOCS.rglob("*")):
        if not path.is_file():
            continue
        for sentence in re.split(r"(?<=[.?!])\s+", path.read_text(encoding="utf-8")):
            text = " ".join(sentence.split())
            if 30 <= len(text) <= 200 and not text.startswith("#"):
                seen.setdefault(text, None)
    return list(seen)


@dataclass
class Stats:
    label: str
    server_ms: list[float]
    client_ms: list[float]
    hits: int
    cache_ms: list[float]

    def pct(self, values: list[float], q: float) -> float:
        return float(np.percentile(values, q))

    def row(self) -> str:
        s, c = self.server_ms, self.client_ms
        return (
            f"| {self.label} | {len(s)} | {self.hits} | {self.pct(s, 50):.3f} | {self.pct(s, 95):.3f} | "
            f"{self.pct(s, 99):.3f} | {self.pct(c, 50):.3f} | {self.pct(c, 95):.3f} | {self.pct(c, 99):.3f} | "
            f"{self.pct(self.cache_ms, 50):.3f} | {self.pct(self.cache_ms, 95):.3f} |"
        )


async def run_phase(
    client: RagClient, label: str, queries: list[str], cache: StoreBackedCache | None, budget_ms: int
) -> Stats:
    server_ms: list[float] = []
    client_ms: list[float] = []
    cache_ms: list[float] = []
    hits = 0
    for query in queries:
        t0 = time.perf_counter()
        response = await client.retrieve(query, top_k=TOP_K, budget_ms=budget_ms)
        client_ms.append((time.perf_counter() - t0) * 1000.0)
        server_ms.append(response.timings.retrieval_total_ms)
        cache_ms.append(response.timings.cache_ms)
        hits += int(response.cache_hit)
        if cache is not None:
            await cache.drain()  # the write is off the request path; wait so the next phase sees it
    return Stats(label, server_ms, client_ms, hits, cache_ms)


def zipf_workload(queries: list[str], n: int, s: float, seed: int = 7) -> list[str]:
    """`n` requests over `queries` ranked by popularity: P(rank k) proportional to 1 / k**s."""
    ranks = np.arange(1, len(queries) + 1, dtype=np.float64)
    p = ranks**-s
    p /= p.sum()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(queries))  # which query gets which popularity rank
    picks = rng.choice(len(queries), size=n, p=p)
    return [queries[order[i]] for i in picks]


async def main(args: argparse.Namespace) -> None:
    queries = corpus_queries()
    if len(queries) < args.requests + 20:
        raise SystemExit(f"only {len(queries)} distinct queries; ask for fewer --requests")
    warm, measured = queries[:20], queries[20 : 20 + args.requests]
    # A generous budget: a miss cut short by the budget is not cached, and this measures the cache,
    # not the budget (on a loaded 2-core host many misses overrun the default 70 ms).
    budget = args.budget_ms

    with tempfile.TemporaryDirectory() as tmp:
        embedder = SentenceTransformerEmbedder()
        index_root = Path(tmp) / "index"
        build_index(SAMPLE_DOCS, index_root, embedder, progress=False)
        index = HnswIndex.load(index_root)
        executor = ThreadPoolExecutor(2)
        pipeline = assemble_pipeline(embedder, index, None, executor)
        redis_server = RedisProcess(Path(tmp))
        redis_server.start()
        try:
            memory = StoreBackedCache(MemoryStore())
            redis_cache = StoreBackedCache(
                RedisStore(redis_server.url, namespace="bench", timeout_s=args.redis_timeout_ms / 1000.0),
                breaker=CircuitBreaker(3, 1.0),
            )
            await redis_cache.start()
            results: list[Stats] = []
            zipf_rows: list[str] = []
            async with serve_pipeline(pipeline) as target, RagClient(target) as client:
                pipeline.cache = None
                await run_phase(client, "warm-up", warm, None, budget)
                results.append(await run_phase(client, "miss, cache off", measured, None, budget))
                for name, cache in (("in-process", memory), ("Redis", redis_cache)):
                    await cache.flush()
                    pipeline.cache = cache
                    await run_phase(client, "warm-up", warm, cache, budget)
                    results.append(await run_phase(client, f"miss, {name} cache", measured, cache, budget))
                    results.append(await run_phase(client, f"hit, {name} cache", measured, cache, budget))

                workload = zipf_workload(queries, args.zipf_requests, args.zipf_s)
                distinct = len(set(workload))
                # The best any cache can do: every request after a query's first is a hit.
                ideal = 1.0 - distinct / len(workload)
                pipeline.cache = None
                off = await run_phase(client, "Zipf, cache off", workload, None, budget)
                zipf_rows.append(f"| cache off | {len(workload)} | 0 | - | {statistics.median(off.server_ms):.2f} |")
                for name, cache in (("in-process", memory), ("Redis", redis_cache)):
                    await cache.flush()
                    pipeline.cache = cache
                    st = await run_phase(client, f"Zipf, {name}", workload, cache, budget)
                    zipf_rows.append(
                        f"| {name} | {len(workload)} | {st.hits} | {st.hits / len(workload):.1%} (ideal {ideal:.1%}) "
                        f"| {statistics.median(st.server_ms):.2f} |"
                    )
            await redis_cache.close()
        finally:
            redis_server.stop()
            executor.shutdown()

    print(f"machine: {platform.machine()}, {platform.python_version()}; corpus {index.count} chunks; top_k {TOP_K}")
    print(
        f"{args.requests} distinct queries per phase, sequential, one long-lived channel, "
        f"budget {args.budget_ms} ms, Redis timeout {args.redis_timeout_ms} ms\n"
    )
    print("| phase | n | hits | server p50 ms | p95 | p99 | client p50 ms | p95 | p99 | cache lookup p50 ms | p95 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for st in results:
        print(st.row())
    base = next(r for r in results if r.label == "miss, cache off")
    print()
    for st in results:
        if st.label.startswith("hit"):
            ratio = statistics.median(base.server_ms) / statistics.median(st.server_ms)
            print(f"{st.label}: server p50 {statistics.median(st.server_ms):.3f} ms, {ratio:.0f}x faster than a miss")
    mem_hit = next(r for r in results if r.label == "hit, in-process cache")
    redis_hit = next(r for r in results if r.label == "hit, Redis cache")
    print(f"target in-process hit p50 <= 1 ms: {'met' if statistics.median(mem_hit.server_ms) <= 1 else 'MISSED'}")
    print(f"target Redis hit p50 <= 3 ms: {'met' if statistics.median(redis_hit.server_ms) <= 3 else 'MISSED'}")
    print(f"\nZipf workload: {args.zipf_requests} requests over {len(queries)} distinct queries, s={args.zipf_s}, "
          f"{distinct} distinct queries drawn")  # fmt: skip
    print("| cache | requests | hits | hit rate | server p50 ms |")
    print("|---|---|---|---|---|")
    for row in zipf_rows:
        print(row)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--zipf-requests", type=int, default=3000)
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--redis-timeout-ms", type=float, default=20.0)
    parser.add_argument("--budget-ms", type=int, default=5000)
    asyncio.run(main(parser.parse_args()))
