"""Cold start, warm cache: first visits on a fresh server with no history, with and without warming.

    python benchmarks/bench_cold_start.py --out bench-results/cold-start --rounds 3
    python benchmarks/bench_cold_start.py --out /tmp/cold-smoke --questions 20

Indexes `<data>/corpus.jsonl` (SQuAD v2 dev; not shipped) and starts a fresh server with no
retrieval counts, three times, answer cache off, one question at a time, temperature 0:

  cold      RAGSERVE_WARM_PASSAGES=0: every question's top passage is a first visit
  warm      the default: warming pre-fills what fits once SERVING; asked after it finished
  during    the default, asked from the moment the server is SERVING, while warming runs

Each row asks the answerable questions whose gold paragraphs are all different (one question per
paragraph: every one a first visit; all of them unless --questions says fewer). With --rounds R
the three rows run R times, each on fresh servers, and the percentiles pool every round's
questions (p95 over R times as many first visits, so it is measured rather than drawn from a few
slow ones); each round's own ratios are listed too. Reported: TTFT p50/p95 of each row, the
warm/cold ratios, time to SERVING and to warm, passages and tokens pre-filled and left cold (from
Info), and the server's RSS once warm. With --corpus-too-big, the same index is also warmed (once)
with RAGSERVE_WARM_KV_SHARE small enough that it cannot all fit, to show what is left out. With
--history-corpus DIR (a BEIR folder, e.g. SciFact: a corpus far larger than the KV share), a
first server answers --history-queries of its queries and saves their retrieval counts; a second
one starts with those counts and warms what fits, most retrieved first; then the same queries
(revisits) and as many others (new) are asked: how often each group's top passage was warm, and
their TTFT. Writes results.md and results.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    ensure_index,
    git_head,
    load_avg,
    percentile,
    start_server,
    stop_server,
    write_results,
)
from benchmarks.workloads import WARMUP, Question, ask, load_questions, wait_warm  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402


def first_visits(questions: list[Question], count: int) -> list[Question]:
    """Answerable questions, one per paragraph: each one's top passage is new to the server (`count`
    of them; 0: all)."""
    seen: set[str] = set()
    picked = []
    for q in questions:
        if q.impossible or q.doc_id in seen:
            continue
        seen.add(q.doc_id)
        picked.append(q)
        if len(picked) == count:
            break
    return picked


async def info(target: str) -> Any:
    async with RagClient(target) as client:
        return await client.info()


async def settled(target: str) -> Any:
    async with RagClient(target) as client:
        return await wait_warm(client)


async def drive(target: str, questions: list[Question], max_tokens: int) -> list[dict[str, Any]]:
    async with RagClient(target, default_timeout_s=120) as client:
        return [await ask(client, q, max_tokens) for q in questions]


def rss_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def run(args: argparse.Namespace, name: str, env: dict[str, str], questions: list[Question]) -> dict[str, Any]:
    """One fresh server (no counts file): time to SERVING, the questions (after warming, or during
    it), what warming did and the RSS."""
    counts = args.out / f"hot-{name}.json"
    counts.unlink(missing_ok=True)
    env = {
        "RAGSERVE_CACHE_ANSWERS": "false",
        "RAGSERVE_HOT_PASSAGES_PATH": str(counts),
        "RAGSERVE_WARM_WHOLE_CORPUS": "true",
        **env,
    }
    started = time.perf_counter()
    process, target = start_server(args.index, env, args.out / f"sidecar-{name}.log")
    serving_s = time.perf_counter() - started
    try:
        if name != "during":
            warming = asyncio.run(settled(target))
            warm_s = time.perf_counter() - started
            rows = asyncio.run(drive(target, [WARMUP, *questions], args.max_tokens))[1:]
        else:
            rows = asyncio.run(drive(target, questions, args.max_tokens))
            warming = asyncio.run(info(target)).warming  # how far warming got meanwhile
            warm_s = 0.0
        rss = rss_mib(process.pid)
    finally:
        stop_server(process)
    result = {
        "rows": rows,
        "serving_s": serving_s,
        "warm_s": warm_s,
        "warm_passages": warming.passages,
        "warm_tokens": warming.tokens,
        "warm_left_out": warming.left_out,
        "warm_done": warming.done,
        "rss_mib": rss,
        **summary(rows),
    }
    print(
        f"[{name}] TTFT p50 {result['ttft_p50']:.0f} / p95 {result['ttft_p95']:.0f} ms, cached "
        f"{result['cached_mean']:.0f}, SERVING {serving_s:.1f} s, warm {warm_s:.1f} s, "
        f"{warming.passages} passages warm, {warming.left_out} cold; load {load_avg()}",
        flush=True,
    )
    return result


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """TTFT percentiles of the rows that answered, and where their time went (server-side p50)."""
    ok = [r for r in rows if r["ok"] and "ttft_ms" in r]
    return {
        "ttft_p50": percentile([r["ttft_ms"] for r in ok], 50),
        "ttft_p95": percentile([r["ttft_ms"] for r in ok], 95),
        "retrieval_p50": percentile([r["retrieval_ms"] for r in ok], 50),
        "context_p50": percentile([r["context_ms"] for r in ok], 50),
        "engine_p50": percentile([r["server_ttft_ms"] - r["retrieval_ms"] - r["context_ms"] for r in ok], 50),
        "cached_mean": sum(r["cached_tokens"] for r in ok) / max(1, len(ok)),
        "uncached_mean": sum(r["prompt_tokens"] - r["cached_tokens"] for r in ok) / max(1, len(ok)),
        "errors": len(rows) - len(ok),
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's rounds as one: percentiles over every round's questions, the rest its median round's."""
    middle = sorted(runs, key=lambda r: r["serving_s"])[len(runs) // 2]
    return {**middle, **summary([row for r in runs for row in r["rows"]]), "rows": []}


def beir_queries(folder: Path) -> list[Question]:
    """A BEIR folder's queries as questions (no gold answers: only retrieval and warmth count here)."""
    rows = [json.loads(line) for line in (folder / "queries.jsonl").read_text().splitlines() if line.strip()]
    return [Question(str(r["_id"]), r["text"], [], False, "") for r in rows]


def history_run(args: argparse.Namespace) -> dict[str, Any]:
    """Warming by history on a corpus larger than its share: counts from a first server, then a
    fresh one that warms the most retrieved first; revisits against new queries."""
    index = ensure_index(args.history_index, args.out / "history", args.history_corpus / "corpus.jsonl")
    queries = beir_queries(args.history_corpus)
    seen, new = queries[: args.history_queries], queries[args.history_queries : 2 * args.history_queries]
    counts = args.out / "hot-history.json"
    counts.unlink(missing_ok=True)
    env = {"RAGSERVE_CACHE_ANSWERS": "false", "RAGSERVE_HOT_PASSAGES_PATH": str(counts)}
    process, target = start_server(index, {**env, "RAGSERVE_WARM_PASSAGES": "0"}, args.out / "sidecar-history-1.log")
    try:
        asyncio.run(drive(target, seen, 4))
    finally:
        stop_server(process)  # the counts are saved on the way out
    counted = len(json.loads(counts.read_text())["counts"])
    started = time.perf_counter()
    env = {**env, "RAGSERVE_WARM_WHOLE_CORPUS": "true"}
    process, target = start_server(index, env, args.out / "sidecar-history-2.log")
    try:
        warming = asyncio.run(settled(target))
        warm_s = time.perf_counter() - started
        rows = asyncio.run(drive(target, [WARMUP, *seen, *new], args.max_tokens))[1:]
    finally:
        stop_server(process)
    template = min(r["cached_tokens"] for r in rows if r["ok"])  # a top passage not warm: the template alone

    def group(part: list[dict[str, Any]]) -> dict[str, float]:
        ok = [r for r in part if r["ok"] and "ttft_ms" in r]
        return {
            "top_warm": sum(r["cached_tokens"] > template + 32 for r in ok) / max(1, len(ok)),
            "ttft_p50": percentile([r["ttft_ms"] for r in ok], 50),
            "ttft_p95": percentile([r["ttft_ms"] for r in ok], 95),
        }

    result = {
        "rows": rows,
        "counted": counted,
        "warm_passages": warming.passages,
        "warm_left_out": warming.left_out,
        "warm_s": warm_s,
        "revisits": group(rows[: len(seen)]),
        "new": group(rows[len(seen) :]),
    }
    print(f"[history] {result['revisits']} / {result['new']}, {warming.passages} warm, {warming.left_out} left out")
    return result


def history_lines(args: argparse.Namespace, r: dict[str, Any]) -> list[str]:
    revisits, new = r["revisits"], r["new"]
    return [
        f"# Warming by history on a corpus larger than its share ({args.history_corpus.name})",
        "",
        f"Host: {read_host_cpu().describe()}. Commit {git_head()}. {args.history_queries} queries answered by a "
        f"first server ({r['counted']} top passages counted), then a fresh server with those counts; max_tokens "
        f"{args.max_tokens}, one at a time, answer cache off.",
        "",
        f"- warmed {r['warm_passages']} passages, left {r['warm_left_out']} out; warm {r['warm_s']:.1f} s after start",
        "",
        "| queries | top passage warm | TTFT p50 / p95 ms |",
        "|---|---|---|",
        *(
            f"| {name} | {g['top_warm']:.2f} | {g['ttft_p50']:.0f} / {g['ttft_p95']:.0f} |"
            for name, g in (("revisits (counted)", revisits), ("new", new))
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "cold-start")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--questions", type=int, default=0, help="first visits per row (0: every paragraph's)")
    parser.add_argument("--rounds", type=int, default=1, help="times to run the three rows, on fresh servers")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--corpus-too-big", action="store_true", help="also warm with a share the corpus exceeds")
    parser.add_argument("--history-corpus", type=Path, help="a BEIR folder larger than the KV share (SciFact)")
    parser.add_argument("--history-index", type=Path)
    parser.add_argument("--history-queries", type=int, default=100)
    parser.add_argument("--history-only", action="store_true", help="only the --history-corpus run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.history_only:
        history = history_run(args)
        write_results(args.out, "\n".join(history_lines(args, history)) + "\n", {"history": history})
        return
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = first_visits(load_questions(args.data, args.seed), args.questions)
    load_before = load_avg()
    rounds = [
        {
            "cold": run(args, "cold", {"RAGSERVE_WARM_PASSAGES": "0"}, questions),
            "warm": run(args, "warm", {}, questions),
            "during": run(args, "during", {}, questions),
        }
        for _ in range(args.rounds)
    ]
    results = {name: pooled([r[name] for r in rounds]) for name in ("cold", "warm", "during")}
    if args.corpus_too_big:
        results["too-big"] = run(args, "too-big", {"RAGSERVE_WARM_KV_SHARE": "0.01"}, questions)
    cold, warm, during = results["cold"], results["warm"], results["during"]
    lines = [
        "# Cold start, warm cache (SQuAD v2 dev sample, first visits, through Query)",
        "",
        f"Host: {read_host_cpu().describe()}. Commit {git_head()}. Load before: {load_before}. "
        f"{len(questions)} answerable questions, one per paragraph, max_tokens {args.max_tokens}, one at a "
        f"time, answer cache off, a fresh server with no retrieval counts for each row; {args.rounds} round(s), "
        "percentiles over all of them (the other columns: the median round's).",
        "",
        "| run | TTFT p50 / p95 ms | cached tokens / request | to SERVING s | to warm s | passages warm / cold "
        "| warm tokens | RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['ttft_p50']:.0f} / {r['ttft_p95']:.0f} | {r['cached_mean']:.0f} | {r['serving_s']:.1f} "
            f"| {r['warm_s']:.1f} | {r['warm_passages']} / {r['warm_left_out']} | {r['warm_tokens']} "
            f"| {r['rss_mib']:.0f} |"
        )
    lines += [
        "",
        f"- warm / cold TTFT: p50 {warm['ttft_p50'] / cold['ttft_p50']:.2f}x, "
        f"p95 {warm['ttft_p95'] / cold['ttft_p95']:.2f}x",
        "- each round's warm / cold TTFT (p50, p95): "
        + "; ".join(
            f"{w['ttft_p50'] / c['ttft_p50']:.2f}x, {w['ttft_p95'] / c['ttft_p95']:.2f}x"
            for c, w in ((r["cold"], r["warm"]) for r in rounds)
        ),
        f"- asked while warming ran / cold: p95 {during['ttft_p95'] / cold['ttft_p95']:.2f}x "
        f"(p50 {during['ttft_p50'] / cold['ttft_p50']:.2f}x)",
        f"- SERVING with warming / without: {warm['serving_s'] / cold['serving_s']:.2f}x",
        "- where a first visit's time goes, server-side p50 (retrieval / context fitting / the rest, mostly the "
        "engine, ms; prompt tokens not cached): "
        + "; ".join(
            f"{name} {r['retrieval_p50']:.1f} / {r['context_p50']:.1f} / {r['engine_p50']:.1f}, "
            f"{r['uncached_mean']:.0f} uncached"
            for name, r in (("cold", cold), ("warm", warm))
        ),
    ]
    results["rounds"] = rounds
    write_results(args.out, "\n".join(lines) + "\n", results)


if __name__ == "__main__":
    main()
