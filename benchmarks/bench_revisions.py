"""Hot-path cost of a change: this checkout against a baseline tree, side by side in one run.

    git worktree add /tmp/ragserve-base 048e383      # the code before the change
    python benchmarks/bench_revisions.py --baseline /tmp/ragserve-base --out bench-results/revisions

Each tree indexes `../shared/data/squad2-dev/corpus.jsonl` with its own indexer and serves it from
its own `ragserve serve` process (real MiniLM, hnswlib, vLLM) with the same settings; both run at
once. Requests alternate between the two servers one by one (the order flips every request, so
drift on a shared machine lands on both), never two at a time:

  * Retrieve, each question twice: the first is a retrieval-cache miss, the second a hit;
  * Query (other questions than Retrieve's, so the retrieval cache does not hide the path), once
    each: client and server TTFT.

Printed and written to OUT/results.md: p50/p95/p99 per tree and the p50 difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import git_head, load_avg, percentile, start_server, stop_server  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402

# Both servers on one 2-core host: no answers from the answer cache (each question is asked once
# anyway), short answers (TTFT is the figure), whatever else is the default of each tree.
SERVER_ENV = {"RAGSERVE_LOG_LEVEL": "WARNING"}


def load_questions(data: Path) -> list[str]:
    with (data / "questions.jsonl").open() as f:
        return [json.loads(line)["question"] for line in f if line.strip()]


def build_index(tree: Path, corpus: Path, index: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "indexer", "build", str(corpus), "--out", str(index), "--no-progress"],
        check=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )


async def timed_retrieve(client: RagClient, question: str) -> tuple[float, float, bool]:
    started = time.perf_counter()
    response = await client.retrieve(question, timeout_s=30.0)
    client_ms = (time.perf_counter() - started) * 1000.0
    return client_ms, response.timings.retrieval_total_ms, response.cache_hit


async def timed_query(client: RagClient, question: str, max_tokens: int) -> tuple[float, float]:
    started = time.perf_counter()
    client_ttft = float("nan")
    server_ttft = float("nan")
    async for event in client.query(question, max_tokens=max_tokens, temperature=0.0, timeout_s=120.0):
        kind = event.WhichOneof("event")
        if kind == "token" and client_ttft != client_ttft:
            client_ttft = (time.perf_counter() - started) * 1000.0
        elif kind == "final":
            server_ttft = event.final.timings.ttft_ms
    return client_ttft, server_ttft


def row(name: str, samples: dict[str, list[float]]) -> list[str]:
    base, new = samples["baseline"], samples["current"]
    cells = [name]
    for values in (base, new):
        cells += [f"{percentile(values, q):.1f}" for q in (50, 95, 99)]
    cells.append(f"{percentile(new, 50) - percentile(base, 50):+.2f}")
    return cells


Series = dict[str, dict[str, list[float]]]  # measure -> tree -> samples (ms)


async def drive(targets: dict[str, str], questions: list[str], args: argparse.Namespace) -> Series:
    names = list(targets)
    series: Series = {}

    def add(metric: str, tree: str, value: float) -> None:
        series.setdefault(metric, {n: [] for n in names}).setdefault(tree, []).append(value)

    clients = {name: RagClient(target) for name, target in targets.items()}
    try:
        for client in clients.values():
            await client.wait_ready()
            for _ in range(args.warmup):
                await client.retrieve("warm-up question about the documents", timeout_s=60.0)
                async for _event in client.query("What are these documents about?", max_tokens=4, timeout_s=600.0):
                    pass
        retrieve_qs = questions[: args.retrieves]
        query_qs = questions[args.retrieves : args.retrieves + args.queries]
        for i, question in enumerate(retrieve_qs):
            order = names if i % 2 == 0 else names[::-1]
            for attempt in ("miss", "hit"):
                for name in order:
                    client_ms, server_ms, hit = await timed_retrieve(clients[name], question)
                    if (attempt == "hit") != hit:
                        continue  # e.g. a question that repeats an earlier one: not this bucket
                    add(f"Retrieve {attempt}, client", name, client_ms)
                    add(f"Retrieve {attempt}, server", name, server_ms)
        for i, question in enumerate(query_qs):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                client_ttft, server_ttft = await timed_query(clients[name], question, args.max_tokens)
                add("Query TTFT, client", name, client_ttft)
                add("Query TTFT, server", name, server_ttft)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{len(query_qs)} queries", flush=True)
    finally:
        for client in clients.values():
            await client.close()
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "revisions")
    parser.add_argument("--retrieves", type=int, default=200, help="questions for Retrieve (each asked twice)")
    parser.add_argument("--queries", type=int, default=60, help="questions for Query")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--current-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the current tree's server only (e.g. RAGSERVE_READER_ENABLED=false: a part the "
        "baseline lacks, left out to compare the rest)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"baseline": args.baseline.resolve(), "current": REPO}
    questions = list(dict.fromkeys(load_questions(args.data)))  # distinct, file order
    if len(questions) < args.retrieves + args.queries:
        raise SystemExit(f"only {len(questions)} distinct questions in {args.data}")
    processes = []
    targets: dict[str, str] = {}
    try:
        for name, tree in trees.items():
            index = args.out / f"index-{name}"
            build_index(tree, args.data / "corpus.jsonl", index)
            env = {**SERVER_ENV, "PYTHONPATH": str(tree)}
            if name == "current":
                env.update(item.split("=", 1) for item in args.current_env)
            process, target = start_server(index, env, args.out / f"server-{name}.log", repo=tree)
            processes.append(process)
            targets[name] = target
        series = asyncio.run(drive(targets, questions, args))
    finally:
        for process in processes:
            stop_server(process)
    revs = {name: git_head(tree) for name, tree in trees.items()}
    cpu = read_host_cpu()
    header = ["measure (ms)", "baseline p50", "p95", "p99", "current p50", "p95", "p99", "p50 change"]
    lines = [
        f"CPU: {cpu.describe()}",
        f"baseline {revs['baseline']}, current {revs['current']} (+ working tree); load at the end {load_avg()}",
        f"current tree's own settings: {', '.join(args.current_env) or 'none'}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for metric, samples in series.items():
        lines.append("| " + " | ".join(row(f"{metric} (n={len(samples['current'])})", samples)) + " |")
    text = "\n".join(lines) + "\n"
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(series))
    print(text)


if __name__ == "__main__":
    main()
