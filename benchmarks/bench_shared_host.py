"""Interactive TTFT when the sidecar is not alone: batch traffic inside, a busy process beside it.

    python benchmarks/bench_shared_host.py --out bench-results/shared-host
    python benchmarks/bench_shared_host.py --out /tmp/shared-smoke --questions 10

One `ragserve serve` (default settings) on loopback over the SQuAD v2 dev index; interactive
questions arrive at a steady rate (`--interval`), one at a time, through `Query`. Phases, one run:

  alone                         nothing else
  batch flood (classes on)      `--batch-clients` clients asking long answers as REQUEST_CLASS_BATCH
  batch flood (classes off)     the same flood sent as interactive (what callers did before classes)
  neighbour (2 threads)         a 2-thread torch job beside the server (what `ragserve-index` was)
  neighbour (nice 10 1 thread)  the same job at nice 10 on one thread (the indexer's default)
  alone again                   nothing else, once more (the first phase also warms the server)
  compile (nice 19)             two g++ compiles at a time at nice 19 beside it, in a session of their
                                own (setsid: a CI agent's build, another terminal's)
  nice 19 cpu jobs (same session)     two pure-Python CPU loops at nice 19, in the server's session
  nice 19 memory jobs (same session)  two numpy jobs streaming 256 MB arrays, the same way
  alone during warming          right after SERVING, while warming pre-fills the corpus (not by default:
  batch flood during warming    put them first, with RAGSERVE_WARM_WHOLE_CORPUS=true in --config)
  compile during warming        the compiles right after SERVING

`--phases` picks some of them (comma-separated, in the order given); `--repeat N` runs them N times;
`--config "name:KEY=VALUE,KEY=VALUE"` (repeatable) compares server settings, one server each.

Reported per phase: interactive TTFT p50/p95/p99 (client), ms/token, batch answers completed per
minute and refused, and the server's own reports (Info.generator_pace, Info.host_share). Writes results.md,
results.json and ttft.png to --out.
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

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import ensure_index, load_avg, percentile, plot_ttft, start_server, stop_server, write_results  # noqa: E402
from benchmarks.neighbours import cxx_build, niced_jobs  # noqa: E402
from benchmarks.workloads import load_questions  # noqa: E402
from ragserve.client import RagClient, RequestClassName  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402

# A torch job beside the server: matrix products on `threads` threads, forever.
NEIGHBOUR = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(768, 768)
while True:
    a = torch.tanh(a @ a)
"""


# name -> (class of the batch flood or None, (nice, threads) of a torch neighbour, COMPILE,
# NICED_CPU / NICED_MEMORY, or None)
COMPILE = "compile"
NICED_CPU = "niced cpu"
NICED_MEMORY = "niced memory"
PHASES: dict[str, tuple[RequestClassName | None, tuple[int, int] | str | None]] = {
    "alone": (None, None),
    "batch flood (classes on)": ("batch", None),
    "batch flood (classes off)": ("interactive", None),
    "neighbour (2 threads)": (None, (0, 2)),
    "neighbour (nice 10 1 thread)": (None, (10, 1)),
    "compile (nice 19)": (None, COMPILE),
    "nice 19 cpu jobs (same session)": (None, NICED_CPU),
    "nice 19 memory jobs (same session)": (None, NICED_MEMORY),
    "alone again": (None, None),
    # Right after SERVING, while warming pre-fills the corpus (run these first, on a server with
    # RAGSERVE_WARM_WHOLE_CORPUS=true so warming lasts): warming must yield to both classes.
    "alone during warming": (None, None),
    "batch flood during warming": ("batch", None),
    "compile during warming": (None, COMPILE),
}
USUAL_PHASES = ",".join(name for name in PHASES if "warming" not in name and "same session" not in name)


async def interactive(client: RagClient, questions: list[str], interval_s: float) -> list[dict[str, Any]]:
    rows = []
    for question in questions:
        started = time.perf_counter()
        row: dict[str, Any] = {"ok": False}
        try:
            async for event in client.query(question, max_tokens=32, temperature=0.0, timeout_s=60):
                kind = event.WhichOneof("event")
                if kind == "token" and "ttft_ms" not in row:
                    row["ttft_ms"] = (time.perf_counter() - started) * 1000.0
                elif kind == "final":
                    row["tpot_ms"] = event.final.timings.time_per_output_token_ms
                    row["retrieval_ms"] = event.final.timings.retrieval_total_ms
                    row["ok"] = True
        except grpc.aio.AioRpcError as exc:
            row["code"] = exc.code().name
        rows.append(row)
        await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - started)))
    return rows


async def flood(
    client: RagClient, request_class: RequestClassName, stats: dict[str, int], stop: asyncio.Event, seed: int
) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        question = f"Write a long, detailed essay about the history of the Normans, part {seed}-{i}."
        try:
            async for _ in client.query(
                question, max_tokens=200, temperature=0.7, timeout_s=120, request_class=request_class
            ):
                if stop.is_set():
                    break
            else:
                stats["completed"] += 1
        except grpc.aio.AioRpcError as exc:
            stats["refused" if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "failed"] += 1
            await asyncio.sleep(0.1)


async def phase(
    target: str, questions: list[str], args: argparse.Namespace, batch: RequestClassName | None
) -> dict[str, Any]:
    stats = {"completed": 0, "refused": 0, "failed": 0}
    stop = asyncio.Event()
    async with RagClient(target, default_timeout_s=120) as client:
        floods = (
            []
            if batch is None
            else [asyncio.create_task(flood(client, batch, stats, stop, i)) for i in range(args.batch_clients)]
        )
        await asyncio.sleep(3.0 if batch else 0.0)  # the flood fills the engine first
        started = time.perf_counter()
        rows = await interactive(client, questions, args.interval)
        seconds = time.perf_counter() - started
        info = await client.info()
        warming = "" if not info.HasField("warming") else ("done" if info.warming.done else "still warming")
        pace = info.generator_pace
        share = (
            f"neighbours {info.host_share.neighbour_cpus:.1f} of {info.host_share.usable_cpus} CPUs, "
            f"engine threads {info.host_share.engine_threads}"
            if info.HasField("host_share")
            else "no share report"
        )
        stop.set()
        for task in floods:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return {
        "rows": rows,
        "batch": stats,
        "seconds": seconds,
        "pace": pace,
        "share": share,
        "load": load_avg(),
        "warming_at_end": warming,
    }


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's figures, its repeats pooled; the reports are the last repeat's."""
    rows = [r for result in repeats for r in result["rows"]]
    ok = [r for r in rows if r["ok"] and "ttft_ms" in r]
    ttft = [r["ttft_ms"] for r in ok]
    seconds = sum(result["seconds"] for result in repeats)
    return {
        "n": len(rows),
        "errors": len(rows) - len(ok),
        "p50": percentile(ttft, 50),
        "p95": percentile(ttft, 95),
        "p99": percentile(ttft, 99),
        "max": max(ttft, default=float("nan")),
        "tpot_p50": percentile([r["tpot_ms"] for r in ok if r.get("tpot_ms")], 50),
        "retrieval_p99": percentile([r["retrieval_ms"] for r in ok if "retrieval_ms" in r], 99),
        "batch_per_min": sum(result["batch"]["completed"] for result in repeats) * 60.0 / seconds,
        "batch_refused": sum(result["batch"]["refused"] for result in repeats),
        "pace": repeats[-1]["pace"],
        "share": repeats[-1]["share"],
        "warming_at_end": repeats[-1].get("warming_at_end", ""),
    }


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    """ "name[@TREE]:KEY=VALUE,KEY=VALUE" -> (name, settings)."""
    name, _, settings = text.partition(":")
    return name, dict(item.split("=", 1) for item in settings.split(",") if item)


def print_phase(label: str, s: dict[str, Any]) -> None:
    print(f"[{label}] TTFT p50 {s['p50']:.0f} p95 {s['p95']:.0f} "
          f"p99 {s['p99']:.0f} max {s['max']:.0f} ms; retrieval p99 {s['retrieval_p99']:.1f} ms; "
          f"batch {s['batch_per_min']:.1f}/min; pace {s['pace']}; {s['share']}; "
          f"warming at the end: {s['warming_at_end'] or 'no report'}", flush=True)  # fmt: skip


@contextlib.contextmanager
def beside(neighbour: tuple[int, int] | str | None) -> Iterator[None]:
    """The phase's neighbour, running for the whole phase (none: nothing)."""
    if neighbour == COMPILE:
        with cxx_build(jobs=2, nice=19):
            time.sleep(3.0)
            yield
        return
    if neighbour in (NICED_CPU, NICED_MEMORY):
        with niced_jobs("cpu" if neighbour == NICED_CPU else "memory", jobs=2, nice=19):
            time.sleep(3.0)
            yield
        return
    job = None
    if isinstance(neighbour, tuple):
        nice, threads = neighbour
        job = subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR, str(threads)],
            preexec_fn=(lambda n=nice: os.nice(n)) if nice else None,
        )
        time.sleep(3.0)
    try:
        yield
    finally:
        if job is not None:
            job.kill()
            job.wait()


def run_config(
    name: str, env: dict[str, str], args: argparse.Namespace, pool: list[str], plan: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """Every phase of `plan`, `args.repeat` times, on one server; results per phase, one per repeat."""
    server_env = {"RAGSERVE_CACHE_ANSWERS": "false", **env}
    # "name@TREE": that source tree's server (a worktree of an earlier commit), same client.
    name, _, tree = name.partition("@")
    log = args.out / f"server-{name}.log"
    process, target = start_server(args.index, server_env, log, repo=Path(tree) if tree else REPO)
    results: dict[str, list[dict[str, Any]]] = {phase_name: [] for phase_name in plan}
    asked = 0
    try:
        for repeat in range(args.repeat):
            for phase_name in plan:
                batch, neighbour = PHASES[phase_name]
                questions = [pool[(asked + k) % len(pool)] for k in range(args.questions)]
                asked += args.questions
                with beside(neighbour):
                    result = asyncio.run(phase(target, questions, args, batch))
                results[phase_name].append(result)
                print_phase(f"{name} / {phase_name} #{repeat + 1}", summarize([result]))
    finally:
        stop_server(process)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "shared-host")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--questions", type=int, default=40, help="interactive questions per phase")
    parser.add_argument("--interval", type=float, default=0.6)
    parser.add_argument("--batch-clients", type=int, default=6)
    parser.add_argument("--phases", default=USUAL_PHASES, help=f"comma-separated, of: {', '.join(PHASES)}")
    parser.add_argument("--repeat", type=int, default=1, help="run the phases this many times per configuration")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help='"name:KEY=VALUE,KEY=VALUE": server settings to compare, one server each, in order (default: '
        '"default:", the defaults)',
    )
    args = parser.parse_args()
    plan = args.phases.split(",")
    unknown = set(plan) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    configs = [parse_config(text) for text in args.config or ["default:"]]
    args.out.mkdir(parents=True, exist_ok=True)
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    pool = [q.question for q in load_questions(args.data, seed=3)]
    load_before = load_avg()
    results = {name: run_config(name, env, args, pool, plan) for name, env in configs}
    idle = [p for p in plan if PHASES[p] == (None, None) and "warming" not in p]
    lines = [
        "# Interactive TTFT on a shared host (SQuAD v2 dev, through Query)",
        "",
        f"Host: {read_host_cpu().describe()}. Load before: {load_before}. {args.questions} interactive questions "
        f"per phase, one every {args.interval} s, max_tokens 32; batch: {args.batch_clients} clients, max_tokens 200. "
        f"Each phase ran {args.repeat} time(s) per configuration; percentiles pool the repeats. "
        f"Configurations: {dict(configs)}. p95 / idle: against the same configuration's phases with nothing "
        f"beside it ({', '.join(idle) or 'none run'}), pooled.",
        "",
        "| configuration | phase | TTFT p50 / p95 / p99 / max ms | p95 / idle | worst repeat p95 | retrieval p99 ms "
        "| ms/token p50 | batch answers/min | batch refused | errors | last pace and share reports |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, phases in results.items():
        idle_p95 = summarize([r for p in idle for r in phases[p]])["p95"] if idle else float("nan")
        for phase_name, repeats in phases.items():
            s = summarize(repeats)
            worst = max(summarize([r])["p95"] for r in repeats)
            lines.append(
                f"| {name} | {phase_name} | {s['p50']:.0f} / {s['p95']:.0f} / {s['p99']:.0f} / {s['max']:.0f} "
                f"| {s['p95'] / idle_p95:.2f} | {worst:.0f} | {s['retrieval_p99']:.1f} | {s['tpot_p50']:.1f} "
                f"| {s['batch_per_min']:.1f} | {s['batch_refused']} | {s['errors']} | {s['pace']}; {s['share']} |"
            )
    write_results(args.out, "\n".join(lines) + "\n", results)
    series = {
        f"{name} / {phase_name}": [
            r["ttft_ms"] for result in repeats for r in result["rows"] if r["ok"] and "ttft_ms" in r
        ]
        for name, phases in results.items()
        for phase_name, repeats in phases.items()
    }
    plot_ttft(series, args.out, "interactive client TTFT (ms, log)", log_x=True)


if __name__ == "__main__":
    main()
