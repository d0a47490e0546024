"""What the MCP door costs over gRPC: the same questions through both doors of one real server.

    python benchmarks/bench_doors.py --out bench-results/doors
    python benchmarks/bench_doors.py --out /tmp/doors --questions 10 --slow one-core

Indexes `<data>/corpus.jsonl` (default ../shared/data/squad2-dev next to the repository), starts
one real `ragserve serve` (the embedded default; caches off, so that every ask does the work) with
the MCP door on, then asks each question through gRPC and through MCP, alternating which goes
first (the second ask of a question finds the engine's prefix cache warm from the first):

- Retrieve (top_k 10) against the MCP `search` tool: client-side time per call;
- Query (whole answer, temperature 0) against the MCP `answer` tool: client-side time to the
  whole answer (MCP has no tokens to stream: its result is the whole answer).

Both clients keep one connection open across the run (a gRPC channel; an MCP client session,
its HTTP connection pool). `--slow one-core` runs the server on one core (taskset).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    ensure_index,
    free_port,
    git_head,
    load_avg,
    percentile,
    start_server,
    stop_server,
    write_results,
)
from benchmarks.workloads import load_questions  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-dev"


async def _grpc(client: RagClient, kind: str, question: str) -> float:
    started = time.perf_counter()
    if kind == "search":
        await client.retrieve(question, top_k=10)
    else:
        async for _ in client.query(question, temperature=0.0, timeout_s=120):
            pass
    return (time.perf_counter() - started) * 1000.0


async def _mcp(session: Any, kind: str, question: str) -> float:
    started = time.perf_counter()
    arguments = {"query": question, "top_k": 10} if kind == "search" else {"question": question}
    result = await session.call_tool(kind, arguments)
    if result.is_error:
        raise SystemExit(f"MCP {kind} failed: {result.content[0].text}")
    return (time.perf_counter() - started) * 1000.0


async def run(target: str, mcp_url: str, questions: list[str]) -> dict[str, dict[str, list[float]]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    times: dict[str, dict[str, list[float]]] = {k: {"grpc": [], "mcp": []} for k in ("search", "answer")}
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
    async with RagClient(target) as client, http, Client(streamable_http_client(mcp_url, http_client=http)) as mcp:
        await _grpc(client, "search", "warm-up")  # connections and first-call costs out of the figures
        await _mcp(mcp, "search", "warm-up")
        for n, question in enumerate(questions):
            for kind in ("search", "answer"):
                order = [("grpc", _grpc, client), ("mcp", _mcp, mcp)]
                for door, ask, via in order if n % 2 == 0 else order[::-1]:
                    times[kind][door].append(await ask(via, kind, question))  # type: ignore[operator]
    return times


def table(times: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "| call | gRPC p50 / p95 (ms) | MCP p50 / p95 (ms) | MCP - gRPC at p50 (ms) | MCP / gRPC at p50 |",
        "|---|---|---|---|---|",
    ]
    names = {"search": "Retrieve vs `search`", "answer": "Query (whole answer) vs `answer`"}
    for kind, doors in times.items():
        g50, g95 = percentile(doors["grpc"], 50), percentile(doors["grpc"], 95)
        m50, m95 = percentile(doors["mcp"], 50), percentile(doors["mcp"], 95)
        lines.append(
            f"| {names[kind]} | {g50:.1f} / {g95:.1f} | {m50:.1f} / {m95:.1f} | {m50 - g50:+.1f} | {m50 / g50:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--slow", choices=["none", "one-core"], default="none")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = [q.question for q in load_questions(args.data, args.seed)[: args.questions]]
    http_port = free_port()
    env = {"RAGSERVE_CACHE_BACKEND": "off", "RAGSERVE_OPENAI_PORT": str(http_port), "RAGSERVE_MCP_ENABLED": "true"}
    prefix = ("taskset", "-c", "0") if args.slow == "one-core" else ()
    process, target = start_server(index, env, args.out / "server.log", prefix=prefix)
    try:
        times = asyncio.run(run(target, f"http://127.0.0.1:{http_port}/mcp", questions))
    finally:
        stop_server(process)
    slow = "" if args.slow == "none" else f", server on {args.slow}"
    text = "\n".join(
        [
            f"# MCP against gRPC ({cpu_name()}{slow}, load {load_avg()}, {git_head()})",
            f"{len(questions)} SQuAD v2 dev questions, each through both doors, order alternating",
            "",
            table(times),
        ]
    )
    write_results(args.out, text, times)


if __name__ == "__main__":
    main()
