"""The base generator against tuned adapters, through Query, in one run (SQuAD v2 dev).

    python benchmarks/bench_generator.py --out bench-results/generator
    python benchmarks/bench_generator.py --out /tmp/gen-smoke --questions 10
    python benchmarks/bench_generator.py --out /tmp/pick --configs base=none natural=ADAPTER other=ADAPTER

Indexes `<data>/corpus.jsonl` (default ../shared/data/squad2-dev next to the repository), runs
`ragserve prepare-models` for each configuration's RAGSERVE_GENERATOR_ADAPTER (a merge, once),
starts one real `ragserve serve` per configuration (the embedded default, answer cache off), all
up at once, and asks every question of each in turn, alternating servers question by question so
that whatever else loads the host weighs on each alike. Temperature 0, one request at a time.

Per configuration: the answer holds a gold span (answerable questions), exact match (citation
stripped), unanswerable questions declined, answerable questions declined (the final event's
`declined` field, or, for free-form answers, the decline phrases of workloads.declines),
completion tokens, client TTFT and whole-answer time p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, ensure_index, git_head, load_avg, percentile, start_server, stop_server
from benchmarks.workloads import WARMUP, Question, declines, load_questions, wait_warm
from indexer.tune.generator_figures import exact_match, holds_gold
from ragserve.client import RagClient

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-dev"


async def ask(client: RagClient, q: Question, max_tokens: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": q.id, "impossible": q.impossible, "ok": False}
    parts: list[str] = []
    started = time.perf_counter()
    async for event in client.query(q.question, max_tokens=max_tokens, temperature=0.0, timeout_s=120):
        kind = event.WhichOneof("event")
        if kind == "token":
            row.setdefault("ttft_ms", (time.perf_counter() - started) * 1000.0)
            parts.append(event.token.text)
        elif kind == "final":
            row.update(
                completion_tokens=event.final.usage.completion_tokens,
                prompt_tokens=event.final.usage.prompt_tokens,
                declined_field=getattr(event.final, "declined", False),
                ok=True,
            )
    row["total_ms"] = (time.perf_counter() - started) * 1000.0
    row["answer"] = answer = "".join(parts)
    row["declined"] = bool(row.get("declined_field")) or declines(answer)
    if not q.impossible:
        row["gold"] = holds_gold(answer, q.answers)
        row["exact"] = exact_match(answer, q.answers)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in rows if not r["impossible"]]
    unanswerable = [r for r in rows if r["impossible"]]

    def share(group: list[dict[str, Any]], key: str) -> float:
        return sum(bool(r.get(key)) for r in group) / len(group) if group else float("nan")

    tokens = [float(r.get("completion_tokens", 0)) for r in rows]
    ttft = [r["ttft_ms"] for r in rows if "ttft_ms" in r]
    total = [r["total_ms"] for r in rows]
    return {
        "questions": len(rows),
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "gold_held": share(answerable, "gold"),
        "exact_match": share(answerable, "exact"),
        "declined_unanswerable": share(unanswerable, "declined"),
        "declined_answerable": share(answerable, "declined"),
        "completion_tokens_p50": percentile(tokens, 50),
        "completion_tokens_mean": sum(tokens) / len(tokens) if tokens else float("nan"),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "total_p50": percentile(total, 50),
        "total_p95": percentile(total, 95),
        "failed": sum(not r["ok"] for r in rows),
    }


def markdown(meta: dict[str, Any], summaries: dict[str, dict[str, Any]]) -> str:
    names = list(summaries)
    rows = [
        ("answer holds a gold span", "gold_held", 3),
        ("exact match (citation stripped)", "exact_match", 3),
        ("unanswerable declined", "declined_unanswerable", 3),
        ("answerable declined", "declined_answerable", 3),
        ("completion tokens p50 / mean", ("completion_tokens_p50", "completion_tokens_mean"), 1),
        ("client TTFT p50 / p95 (ms)", ("ttft_p50", "ttft_p95"), 0),
        ("whole answer p50 / p95 (ms)", ("total_p50", "total_p95"), 0),
        ("failed requests", "failed", 0),
    ]
    lines = [
        f"# Generator: {' vs '.join(names)} through Query",
        "",
        f"commit {meta['commit']}, {meta['questions']} questions of {meta['data']} "
        f"({summaries[names[0]]['answerable']} answerable, {summaries[names[0]]['unanswerable']} unanswerable), "
        f"load before {meta['load_before']}, after {meta['load_after']}; configurations {meta['configs']}",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for label, key, digits in rows:
        keys = key if isinstance(key, tuple) else (key,)
        cells = [" / ".join(f"{summaries[n][k]:.{digits}f}" for k in keys) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def prepare(adapter: str) -> None:
    env = {**os.environ, "RAGSERVE_GENERATOR_ADAPTER": adapter}
    subprocess.run([sys.executable, "-m", "ragserve.cli", "prepare-models"], check=True, env=env, cwd=REPO)


async def run(args: argparse.Namespace, targets: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    qs = load_questions(args.data, seed=0)[: args.questions]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    clients = {name: RagClient(target) for name, target in targets.items()}
    for client in clients.values():
        await wait_warm(client)
        await ask(client, WARMUP, args.max_tokens)
    for n, q in enumerate(qs, 1):
        for name, client in clients.items():
            rows[name].append(await ask(client, q, args.max_tokens))
        if n % 50 == 0:
            print(f"{n}/{len(qs)} questions", flush=True)
    for client in clients.values():
        await client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--index", type=Path, help="an index of the data's corpus (default: built into OUT/index)")
    parser.add_argument("--questions", type=int, default=None, help="the first N (seeded shuffle); default all")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--configs", nargs="+", default=["base=none", "tuned=default"], help="NAME=ADAPTER")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    configs = dict(spec.split("=", 1) for spec in args.configs)
    servers = {}
    load_before, commit = load_avg(), git_head()  # the code the servers start from
    try:
        for name, adapter in configs.items():
            prepare(adapter)
            env = {"RAGSERVE_GENERATOR_ADAPTER": adapter, "RAGSERVE_CACHE_BACKEND": "off"}
            servers[name] = start_server(index, env, args.out / f"server-{name}.log")
        rows = asyncio.run(run(args, {name: target for name, (_, target) in servers.items()}))
    finally:
        for process, _ in servers.values():
            stop_server(process)
    summaries = {name: summarize(r) for name, r in rows.items()}
    meta = {
        "commit": commit,
        "data": args.data.name,
        "questions": len(next(iter(rows.values()))),
        "load_before": load_before,
        "load_after": load_avg(),
        "configs": configs,
    }
    text = markdown(meta, summaries)
    (args.out / "results.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summaries": summaries, "rows": rows}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
