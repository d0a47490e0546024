"""The retrieval budget beside the engine: Retrieve's server-side time while the engine works.

    python benchmarks/bench_budget.py --index <scifact index root> --out bench-results/budget
    python benchmarks/bench_budget.py --index ... --out ... --slow one-core      # the server on one CPU
    python benchmarks/bench_budget.py --index ... --out ... --slow neighbour     # a nice-19 compile-like
                                                                                 # job on every CPU beside it

SciFact claims through Retrieve (top_k 100 by default), one at a time, each a claim not asked before
(no retrieval cache hit); the figure is the server's own `retrieval_total_ms`. Phases, each on a
fresh server of every `--config`:

  retrieval only     RAGSERVE_GENERATION_ENABLED=false: what retrieval costs with no engine
  warming            the default server right after SERVING, whole-corpus warming running beside
  query stream       the same server once warming is done, while a second client asks Queries one
                     after another (other callers' prefills and decodes beside every Retrieve)

`--config "name:KEY=VALUE,KEY=VALUE"` (repeatable) compares server settings in one run, e.g. the
engine that does not give way:
`--config "before:RAGSERVE_GENERATOR_YIELD_TO_RETRIEVAL_MS=0,RAGSERVE_GENERATOR_STEP_TARGET_MS=0"`.
`--slow one-core` pins the server to one CPU (taskset), so a fast host shows the slow host's case;
`--slow neighbour` runs one busy process per CPU at nice 19 beside it.

Reported per config and phase: Retrieve p50/p95/p99/max (server side), requests over the budget,
and the Queries' client TTFT p50/p95 in the query-stream phase. Writes results.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    git_head,
    load_avg,
    percentile,
    start_client,
    stop_server,
    write_results,
)
from benchmarks.harness import start_server as start_plain_server  # noqa: E402
from benchmarks.workloads import load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

PHASES = ("retrieval only", "warming", "query stream")
# The benchmark servers' defaults turn whole-corpus warming off; the product's default is on.
WARMING_ON = {"RAGSERVE_WARM_WHOLE_CORPUS": "true"}
# A busy loop with no I/O: what a compile job's CPU use looks like to the scheduler.
_BURNER = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def parse_configs(given: list[str]) -> dict[str, dict[str, str]]:
    configs: dict[str, dict[str, str]] = {}
    for spec in given or ["default:"]:
        name, _, pairs = spec.partition(":")
        env = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
        configs[name] = env
    return configs


@contextlib.contextmanager
def neighbours(kind: str) -> Iterator[None]:
    """`neighbour`: one nice-19 busy process per CPU beside the server; otherwise nothing."""
    processes: list[subprocess.Popen[bytes]] = []
    if kind == "neighbour":
        for _ in range(os.cpu_count() or 1):
            processes.append(subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", _BURNER]))
    try:
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def start_server(index: Path, env: dict[str, str], log: Path, slow: str) -> tuple[subprocess.Popen[bytes], str]:
    """The harness's server; with `--slow one-core`, pinned to the first CPU (its children inherit it)."""
    process, target = start_plain_server(index, env, log)
    if slow == "one-core":
        # Every thread of the server and its helper processes, as the host picks settings at start
        # from the affinity it had then: pinning from the start would change what is measured.
        subprocess.run(["taskset", "-a", "-p", "-c", "0", str(process.pid)], check=True, capture_output=True)
    return process, target


async def retrieve_stream(client: RagClient, claims: list[str], top_k: int, until: asyncio.Event | None) -> list[float]:
    """Server-side retrieval ms of each claim, one at a time; stops early when `until` is set."""
    times: list[float] = []
    for claim in claims:
        if until is not None and until.is_set():
            break
        reply = await client.retrieve(claim, top_k=top_k, timeout_s=30)
        times.append(reply.timings.retrieval_total_ms)
    return times


async def warming_done(client: RagClient, done: asyncio.Event) -> None:
    while not done.is_set():
        info = await client.info()
        if info.HasField("warming") and info.warming.done:
            done.set()
            return
        await asyncio.sleep(0.2)


async def query_stream(client: RagClient, claims: list[str], stop: asyncio.Event) -> list[float]:
    """Queries one after another until `stop`: each one's client TTFT in ms."""
    ttfts: list[float] = []
    for claim in claims:
        if stop.is_set():
            break
        started = time.perf_counter()
        first = None
        async for event in client.query(claim, max_tokens=32, timeout_s=60):
            if first is None and event.WhichOneof("event") == "token":
                first = (time.perf_counter() - started) * 1000.0
        if first is not None:
            ttfts.append(first)
    return ttfts


def summary(times: list[float], budget_ms: float) -> dict[str, Any]:
    return {
        "n": len(times),
        "p50": percentile(times, 50),
        "p95": percentile(times, 95),
        "p99": percentile(times, 99),
        "max": max(times, default=float("nan")),
        "over_budget": sum(t > budget_ms for t in times),
    }


async def run_phase(
    phase: str, target: str, claims: list[str], others: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    async with RagClient(target) as client, RagClient(target) as other:
        if phase == "warming":
            done = asyncio.Event()
            watcher = asyncio.ensure_future(warming_done(client, done))
            times = await retrieve_stream(client, claims, args.top_k, done)
            finished = done.is_set()
            done.set()
            await watcher
            return {"retrieve": summary(times, args.budget_ms), "warming_finished_first": finished}
        if phase == "query stream":
            stop = asyncio.Event()
            await warming_done(client, asyncio.Event())
            querying = asyncio.ensure_future(query_stream(other, others, stop))
            await asyncio.sleep(1.0)  # the stream is under way
            times = await retrieve_stream(client, claims, args.top_k, None)
            stop.set()
            ttfts = await querying
            return {"retrieve": summary(times, args.budget_ms), "query_ttft": summary(ttfts, float("inf"))}
        return {"retrieve": summary(await retrieve_stream(client, claims, args.top_k, None), args.budget_ms)}


async def run_config(name: str, env: dict[str, str], claims: list[str], args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    step = args.requests
    for number, phase in enumerate(args.phases):
        phase_env = {**WARMING_ON, **env}
        if phase == "retrieval only":
            phase_env["RAGSERVE_GENERATION_ENABLED"] = "false"
        asked = claims[number * step : (number + 1) * step]
        # The other caller's Queries: claims no Retrieve of this run asks.
        others = claims[len(args.phases) * step :]
        log = args.out / f"server-{name}-{phase.replace(' ', '-')}.log"
        process, target = start_server(args.index, phase_env, log, args.slow)
        try:
            results[phase] = await run_phase(phase, target, asked, others, args)
        finally:
            stop_server(process)
        print(name, phase, results[phase], flush=True)
    return results


def render(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# The retrieval budget beside the engine ({cpu_name()}; slow: {args.slow}; commit {git_head()})",
        "",
        f"Retrieve top_k {args.top_k} on SciFact claims, server-side retrieval_total_ms; budget {args.budget_ms:g} ms.",
        "",
        "| config | phase | n | p50 | p95 | p99 | max | over budget | Query TTFT p50 / p95 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, phases in results.items():
        for phase, result in phases.items():
            r = result["retrieve"]
            ttft = result.get("query_ttft")
            ttft_text = f"{ttft['p50']:.0f} / {ttft['p95']:.0f} ms ({ttft['n']})" if ttft else ""
            lines.append(
                f"| {name} | {phase} | {r['n']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | "
                f"{r['max']:.1f} | {r['over_budget']} | {ttft_text} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of: " + ", ".join(PHASES))
    parser.add_argument("--requests", type=int, default=150, help="Retrieves per phase")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--budget-ms", type=float, default=70.0)
    parser.add_argument("--slow", choices=("none", "one-core", "neighbour"), default="none")
    args = parser.parse_args()
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in args.phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phases: {unknown}")
    args.out.mkdir(parents=True, exist_ok=True)
    start_client()
    claims = list(load_queries(args.data).values())
    results: dict[str, dict[str, Any]] = {}
    with neighbours(args.slow):
        for name, env in parse_configs(args.config).items():
            results[name] = asyncio.run(run_config(name, env, claims, args))
    print(f"load at end {load_avg()}")
    write_results(args.out, render(results, args), results)


if __name__ == "__main__":
    main()
