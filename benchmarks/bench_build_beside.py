"""Retrieve's latency while `ragserve-index build` runs beside the server, against steady.

A retrieval-only `ragserve serve` (no cache) serves INDEX; SciFact questions go to Retrieve
(top_k 10) at a steady pace (--rate per second, each call waited for before the next is due), first
for --steady-s with nothing beside it, then while a `ragserve-index build` of SOURCE into a scratch
root runs with the given flags (default: none, the indexer's own choice of threads and priority).
Prints p50/p99 of each phase, their ratio, and the build's summary and share lines.

    python benchmarks/bench_build_beside.py --index /tmp/scifact-default \\
        --source /work/shared/data/scifact/corpus.jsonl --max-docs 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_index_speed import subset  # noqa: E402
from benchmarks.harness import cpu_name, load_avg  # noqa: E402
from benchmarks.workloads import Server  # noqa: E402


async def paced(target: str, questions: list[str], rate: float, until: object) -> list[float]:
    """Retrieve latencies (ms), one call every 1/rate s, until `until()` is true."""
    import grpc

    from ragserve.v1 import rag_pb2 as pb
    from ragserve.v1 import rag_pb2_grpc as pb_grpc

    times: list[float] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        due = time.perf_counter()
        n = 0
        while not until():  # type: ignore[operator]
            started = time.perf_counter()
            await stub.Retrieve(pb.RetrieveRequest(query=questions[n % len(questions)], top_k=10), timeout=30)
            times.append((time.perf_counter() - started) * 1000)
            n += 1
            due += 1.0 / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
    return times


def summary(name: str, times: list[float]) -> tuple[float, float]:
    p50, p99 = float(np.percentile(times, 50)), float(np.percentile(times, 99))
    print(f"{name:>14}: {len(times)} calls, p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
    return p50, p99


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="the index root the server serves")
    ap.add_argument("--source", type=Path, required=True, help="what the build beside it indexes")
    ap.add_argument("--max-docs", type=int, default=1000)
    ap.add_argument("--queries", type=Path, default=Path("/work/shared/data/scifact/queries.jsonl"))
    ap.add_argument("--rate", type=float, default=10.0, help="Retrieve calls per second")
    ap.add_argument("--steady-s", type=float, default=30.0)
    ap.add_argument("--flags", default="", help="the indexer's flags: '--nice 0 --threads 2 build --backend onnx'")
    args = ap.parse_args()
    questions = [json.loads(line)["text"] for line in args.queries.open()]
    print(f"CPU: {cpu_name()}; load before: {load_avg()}; rate {args.rate}/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-build-beside-") as tmp:
        scratch = Path(tmp)
        source = subset(args.source, args.max_docs, scratch)
        server = Server(args.index, {}, scratch / "server.log")
        try:
            await server.wait_ready()
            warm_until = time.perf_counter() + 3
            await paced(server.target, questions, args.rate, lambda: time.perf_counter() > warm_until)
            end = time.perf_counter() + args.steady_s
            steady_times = await paced(server.target, questions, args.rate, lambda: time.perf_counter() > end)
            _, steady = summary("steady", steady_times)
            words = shlex.split(args.flags)
            head, tail = (words[: words.index("build")], words[words.index("build") + 1 :]) if words else ([], [])
            command = [sys.executable, "-m", "indexer", *head, "build", str(source), "--out", str(scratch / "idx")]
            command += ["--no-progress", "--log-file", str(scratch / "build.log"), *tail]
            started = time.perf_counter()
            build = subprocess.Popen(  # noqa: ASYNC220 (started once; the loop only polls it)
                command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            beside_times = await paced(server.target, questions, args.rate, lambda: build.poll() is not None)
            seconds = time.perf_counter() - started
            _, beside = summary("beside build", beside_times)
            out = build.stdout.read() if build.stdout else ""
        finally:
            server.stop()
        shares = [
            line for line in (scratch / "build.log").read_text().splitlines() if "indexer" in line and "CPU" in line
        ]
    print(f"p99 beside / steady: {beside / steady:.2f}x; the build took {seconds:.1f} s")
    print("build: " + (out.strip().splitlines() or ["(no summary)"])[-1])
    for line in shares:
        print("share: " + line.strip())
    print(f"load after: {load_avg()}")


if __name__ == "__main__":
    asyncio.run(main())
