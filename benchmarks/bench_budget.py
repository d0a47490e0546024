"""The retrieval budget beside the engine: Retrieve's server-side time while the engine works.

    python benchmarks/bench_budget.py --index <scifact index root> --out bench-results/budget
    python benchmarks/bench_budget.py --index ... --out ... --slow one-core      # the server on one CPU
    python benchmarks/bench_budget.py --index ... --out ... --slow compile       # a C++ build at nice 19

SciFact claims through Retrieve (top_k 100 by default), one at a time, each a claim not asked before
(no retrieval cache hit); the figure is the server's own `retrieval_total_ms`. Phases, each on a
fresh server of every `--config`:

  retrieval only     RAGSERVE_GENERATION_ENABLED=false: what retrieval costs with no engine
  warming            the default server right after SERVING, whole-corpus warming running beside
  query stream       the same server once warming is done, while a second client asks Queries one
                     after another (other callers' prefills and decodes beside every Retrieve)

`--config "name[@TREE]:KEY=VALUE,KEY=VALUE"` (repeatable) compares server settings, or another source
tree's server (a worktree of an earlier commit), in one run; e.g. the engine that does not give way:
`--config "before:RAGSERVE_GENERATOR_YIELD_TO_RETRIEVAL_MS=0,RAGSERVE_GENERATOR_STEP_TARGET_MS=0"`.
`--slow one-core` starts the server on one CPU (taskset), so a fast host shows the slow host's case;
`--slow quota` gives the server one CPU's worth of time over every CPU (a cgroup, as root);
`--slow compile` runs a C++ build at nice 19 beside it (one g++ per CPU, benchmarks/neighbours.py).

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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    git_head,
    load_avg,
    percentile,
    slow_prefix,
    start_client,
    stop_server,
    write_results,
)
from benchmarks.harness import start_server as start_plain_server  # noqa: E402
from benchmarks.neighbours import cxx_build  # noqa: E402
from benchmarks.workloads import load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

PHASES = ("retrieval only", "warming", "query stream")
OTHER_CLAIMS = 150
# The benchmark servers' defaults turn whole-corpus warming off; the product's default is on.
WARMING_ON = {"RAGSERVE_WARM_WHOLE_CORPUS": "true"}


def parse_configs(given: list[str]) -> dict[str, tuple[Path, dict[str, str]]]:
    """ "name[@TREE]:KEY=VALUE,..." -> name: (the source tree its server runs, its settings)."""
    configs: dict[str, tuple[Path, dict[str, str]]] = {}
    for spec in given or ["default:"]:
        label, _, pairs = spec.partition(":")
        name, _, tree = label.partition("@")
        env = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
        configs[name] = (Path(tree) if tree else REPO, env)
    return configs


def neighbours(kind: str) -> contextlib.AbstractContextManager[None]:
    """`compile`: a C++ build at nice 19 beside the server, one compile per CPU; otherwise nothing."""
    return cxx_build(jobs=os.cpu_count() or 1, nice=19) if kind == "compile" else contextlib.nullcontext()


def start_server(
    index: Path, env: dict[str, str], log: Path, slow: str, tree: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """The harness's server; with `--slow one-core`, on the first CPU alone from its start (it picks
    its threads from the CPUs it may use, as on a one-core host); with `--slow quota`, on every CPU
    but with one CPU's worth of time (a container's CPU limit, which it is not told of under cgroup v1)."""
    return start_plain_server(index, env, log, repo=tree, prefix=slow_prefix(slow))


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
            return {"retrieve_ms": times, "warming_finished_first": [finished]}
        if phase == "query stream":
            stop = asyncio.Event()
            await warming_done(client, asyncio.Event())
            querying = asyncio.ensure_future(query_stream(other, others, stop))
            await asyncio.sleep(1.0)  # the stream is under way
            times = await retrieve_stream(client, claims, args.top_k, None)
            stop.set()
            ttfts = await querying
            return {"retrieve_ms": times, "query_ttft_ms": ttfts}
        return {"retrieve_ms": await retrieve_stream(client, claims, args.top_k, None)}


async def run_config(
    name: str, config: tuple[Path, dict[str, str]], claims: list[str], args: argparse.Namespace, results: dict[str, Any]
) -> None:
    """Every phase on a fresh server of this config; each phase's raw figures added to `results`."""
    # Every phase asks the same claims (each on a fresh server: no cache carries over); the other
    # caller's Queries ask claims no Retrieve asks.
    others = claims[-OTHER_CLAIMS:]
    asked = claims[: min(args.requests, len(claims) - OTHER_CLAIMS)]
    tree, env = config
    for phase in args.phases:
        phase_env = {**WARMING_ON, "RAGSERVE_MAX_TOP_K": str(max(50, args.top_k)), **env}
        if phase == "retrieval only":
            phase_env["RAGSERVE_GENERATION_ENABLED"] = "false"
        log = args.out / f"server-{name}-{phase.replace(' ', '-')}.log"
        process, target = start_server(args.index, phase_env, log, args.slow, tree)
        try:
            result = await run_phase(phase, target, asked, others, args)
        finally:
            stop_server(process)
        pooled = results.setdefault(phase, {})
        for key, values in result.items():
            pooled.setdefault(key, []).extend(values)
        print(name, phase, summary(result["retrieve_ms"], args.budget_ms), flush=True)


def render(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# The retrieval budget beside the engine ({cpu_name()}; slow: {args.slow}; commit {git_head()})",
        "",
        f"Retrieve top_k {args.top_k} on SciFact claims, server-side retrieval_total_ms; budget {args.budget_ms:g} ms; "
        f"{args.repeat} round(s) of the configs, pooled.",
        "",
        "| config | phase | n | p50 | p95 | p99 | max | over budget | Query TTFT p50 / p95 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, phases in results.items():
        for phase, result in phases.items():
            r = summary(result["retrieve_ms"], args.budget_ms)
            ttft = summary(result["query_ttft_ms"], float("inf")) if "query_ttft_ms" in result else None
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
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every config; phases pool them")
    parser.add_argument("--budget-ms", type=float, default=70.0)
    parser.add_argument("--slow", choices=("none", "one-core", "quota", "compile"), default="none")
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
        # Configs alternate within each repeat, so a drift in the host's speed reaches every one.
        for _ in range(args.repeat):
            for name, config in parse_configs(args.config).items():
                asyncio.run(run_config(name, config, claims, args, results.setdefault(name, {})))
    print(f"load at end {load_avg()}")
    write_results(args.out, render(results, args), results)


if __name__ == "__main__":
    main()
