"""Hot reloads of an index that is already built, under load: bench_scale's reload measurement
(`reload_phases.reload_under_load`, each reload to a copy of the serving version) without rebuilding its corpus.

    python benchmarks/bench_reload.py --index INDEX_ROOT [--repeats 3] [--data ../shared/data/scifact]

One retrieval-only server (hybrid, no reranker, no cache, the settings of bench_scale) reloads
--repeats times. For each reload: Retrieve p99 and max in ms while quiet (steady), while the copy
is written beside the server, from the publish until the server serves it (reload), and after;
p99 again without the requests that a stall of the host overlapped, as a probe process saw them
(`host_stalls.py`: it holds 512 MiB and some 3% of a CPU meanwhile), and how many it saw; the
reload's seconds and the server's peak RSS (its helper processes included). The copy needs the
version's size again on disk; the index root keeps its last two versions (the indexer's rule).
Last, each phase's p99 over the requests of all the reloads together, and their ratios to steady.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_scale import SERVER_ENV, reload_once  # noqa: E402
from benchmarks.harness import index_parser, load_avg, start_client  # noqa: E402
from benchmarks.reload_phases import pooled  # noqa: E402
from benchmarks.workloads import Server, load_queries  # noqa: E402

KEPT = ("reload_s", "peak_rss_mib", "reload requests")


def main() -> None:
    parser = index_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    queries = list(load_queries(args.data).values())[: args.queries]
    start_client()
    env = {**SERVER_ENV, "RAGSERVE_INDEX_RELOAD_INTERVAL_S": "1"}
    server = Server(args.index, env, args.index.parent / "server-bench-reload.log")
    runs = []
    try:
        asyncio.run(server.wait_ready(900))
        for n in range(1, args.repeats + 1):
            run = reload_once(server, queries, args.index, args.index.parent, copies=True)
            shown = {k: round(v, 1) for k, v in run.items() if k.endswith(" ms") or "host stall" in k or k in KEPT}
            print(json.dumps({"reload": n, **shown}), flush=True)
            runs.append(run)
    finally:
        server.stop()
    together = pooled(runs)
    for kind in ("p99 ms", "p99 ms, no host stall"):
        together[f"reload / steady, {kind}"] = together[f"reload {kind}"] / together[f"steady {kind}"]
    print(json.dumps({"all reloads": {k: round(v, 2) for k, v in together.items()}}), flush=True)
    print(f"load at end {load_avg()}")


if __name__ == "__main__":
    main()
