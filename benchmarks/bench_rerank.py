"""Rerank latency benchmark over gRPC on SciFact: budgeted two-tier reranker vs fixed depth, in one run.

    python benchmarks/bench_rerank.py --index <scifact index root> --out bench-results/rerank

(build the index once: `ragserve-index build ../shared/data/scifact/corpus.jsonl --out <dir>`).

Tiers are the architecture-identical MiniLM-L2 / -L6 TEST models (random heads, built by
tests/rerank/models.py): their cost per token is the real models', their order is meaningless, so
this measures latency and achieved depth only, never quality. For each server variant a real server
process is started (real MiniLM embedder, hnswlib + BM25 fusion, ONNX Runtime int8 tiers, real vLLM
engine), the retrieval cache off so every request does the work. Then Retrieve is driven at
concurrency 1, 2, 4 and 8, first on an idle service, then while a steady stream of Query calls
keeps the generator busy. Reported from the server's own timings (RetrieveResponse.timings):
retrieval+rerank p50/p95/p99, share over the budget + 5 ms, and the achieved depth of each tier.

Variants: `budget` (depth from the Deadline, the default policy), `fixed` (tier 1 over 20, tier 2
over 5, whatever the time) and `budget-pinned` (budget policy with the reranker pinned to CPU 1 and
vLLM's OpenMP threads bound to CPU 0).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import load_avg, percentile, start_server, stop_server  # noqa: E402
from benchmarks.workloads import build_all  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

BASE_ENV = {
    "RAGSERVE_RERANK_MODE": "two-tier",
    "RAGSERVE_RERANK_BACKEND": "onnx",
    "RAGSERVE_RERANK_ALLOW_RANDOM_HEADS": "true",  # test models: latency only
    "RAGSERVE_RERANK_CANDIDATES": "20",
    "RAGSERVE_RERANK_TIER1_MAX_DEPTH": "20",
    "RAGSERVE_RERANK_TIER2_MAX_DEPTH": "5",
    "RAGSERVE_CACHE_BACKEND": "off",
    "RAGSERVE_METRICS_PORT": "0",
    "RAGSERVE_LOG_LEVEL": "WARNING",
}
VARIANTS = {
    "budget": {"RAGSERVE_RERANK_DEPTH_POLICY": "budget"},
    "fixed": {"RAGSERVE_RERANK_DEPTH_POLICY": "fixed"},
    "budget-pinned": {
        "RAGSERVE_RERANK_DEPTH_POLICY": "budget",
        "RAGSERVE_RERANK_CPUS": "1",
        "RAGSERVE_GENERATOR_CPU_OMP_THREADS_BIND": "0",
    },
}


@dataclass
class Sample:
    ok: bool
    server_ms: float = 0.0  # timings.retrieval_total_ms: the budgeted part, measured by the server
    rerank_ms: float = 0.0
    embed_search_ms: float = 0.0
    client_ms: float = 0.0
    tier1: int = 0
    tier2: int = 0
    skipped: bool = False
    truncated: bool = False


def queries(corpus: Path) -> list[str]:
    with (corpus / "queries.jsonl").open() as f:
        out = [json.loads(line)["text"] for line in f if line.strip()]
    random.Random(7).shuffle(out)
    return out


def depth(tiers: list[str], name: str) -> int:
    for t in tiers:
        tier, _, n = t.partition(":")
        if tier == name:
            return int(n)
    return 0


async def one_retrieve(client: RagClient, question: str) -> Sample:
    t0 = time.perf_counter()
    try:
        r = await client.retrieve(question, timeout_s=30)
    except Exception:
        return Sample(False)
    return Sample(
        True,
        r.timings.retrieval_total_ms,
        r.timings.rerank_ms,
        r.timings.embed_ms + r.timings.search_ms,
        (time.perf_counter() - t0) * 1000.0,
        depth(list(r.rerank_tiers), "tier1"),
        depth(list(r.rerank_tiers), "tier2"),
        r.degraded.rerank_skipped,
        r.degraded.rerank_truncated,
    )


async def closed_loop(client: RagClient, qs: list[str], concurrency: int, n: int) -> list[Sample]:
    pending = iter(qs[:n])
    samples: list[Sample] = []

    async def worker() -> None:
        for q in pending:
            samples.append(await one_retrieve(client, q))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def generator_load(client: RagClient, qs: list[str], max_tokens: int, counter: list[int]) -> None:
    """One stream of Query calls back to back: the generator is never idle."""
    i = 0
    while True:
        try:
            async for _ in client.query(qs[i % len(qs)], max_tokens=max_tokens, timeout_s=120):
                pass
            counter[0] += 1
        except asyncio.CancelledError:  # the measurement ended
            raise
        except Exception:
            counter[1] += 1
        i += 1


def summarize(variant: str, scenario: str, concurrency: int, samples: list[Sample], budget_ms: float) -> dict:
    ok = [s for s in samples if s.ok]
    server = [s.server_ms for s in ok]
    t1 = [s.tier1 for s in ok]
    t2 = [s.tier2 for s in ok]
    return {
        "variant": variant,
        "scenario": scenario,
        "concurrency": concurrency,
        "n": len(ok),
        "errors": len(samples) - len(ok),
        "p50": percentile(server, 50),
        "p95": percentile(server, 95),
        "p99": percentile(server, 99),
        "max": max(server) if server else float("nan"),
        "over_budget_plus_5": sum(v > budget_ms + 5 for v in server) / max(1, len(server)),
        "rerank_p50": percentile([s.rerank_ms for s in ok], 50),
        "rerank_p99": percentile([s.rerank_ms for s in ok], 99),
        "embed_search_p50": percentile([s.embed_search_ms for s in ok], 50),
        "client_p99": percentile([s.client_ms for s in ok], 99),
        "tier1_mean": sum(t1) / max(1, len(t1)),
        "tier1_p50": percentile([float(v) for v in t1], 50),
        "tier2_mean": sum(t2) / max(1, len(t2)),
        "tier2_ran": sum(v > 0 for v in t2) / max(1, len(t2)),
        "skipped": sum(s.skipped for s in ok) / max(1, len(ok)),
        "truncated": sum(s.truncated for s in ok) / max(1, len(ok)),
        "load_avg": load_avg(),
    }


async def drive(target: str, variant: str, args: argparse.Namespace, qs: list[str]) -> list[dict]:
    rows = []
    async with RagClient(target, default_timeout_s=60) as client:
        info = await client.info()
        print(f"[{variant}] tiers: {list(info.rerank_tiers)}", flush=True)
        await closed_loop(client, qs[-50:], 2, args.warmup)  # cost models settle; first-request costs
        offset = 0
        for scenario in args.scenarios:
            load_tasks: list[asyncio.Task[None]] = []
            counter = [0, 0]
            if scenario == "generating":
                load_tasks = [
                    asyncio.create_task(generator_load(client, qs[::-1], args.max_tokens, counter))
                    for _ in range(args.load_streams)
                ]
                await asyncio.sleep(5.0)  # streams under way before measuring
            for c in args.concurrency:
                n = args.requests
                batch = (qs * 4)[offset : offset + n]
                offset = (offset + n) % len(qs)
                samples = await closed_loop(client, batch, c, n)
                row = summarize(variant, scenario, c, samples, args.budget_ms)
                rows.append(row)
                # Raw samples for reading the tail (results.json); the tables use the summary only.
                row["samples"] = [dataclasses.asdict(sample) for sample in samples]
                print(
                    f"[{variant}/{scenario}] c={c} n={row['n']} p50={row['p50']:.1f} p95={row['p95']:.1f} "
                    f"p99={row['p99']:.1f} ms (embed+search p50 {row['embed_search_p50']:.1f}, rerank p50 "
                    f"{row['rerank_p50']:.1f} p99 {row['rerank_p99']:.1f}); "
                    f"tier1 {row['tier1_mean']:.1f} tier2 {row['tier2_mean']:.1f} "
                    f"(tier2 ran {row['tier2_ran']:.0%}, skipped {row['skipped']:.0%}); load {row['load_avg']}",
                    flush=True,
                )
            for task in load_tasks:
                task.cancel()
            await asyncio.gather(*load_tasks, return_exceptions=True)
            if scenario == "generating":
                print(f"[{variant}/generating] Query calls completed: {counter[0]}, failed: {counter[1]}", flush=True)
    return rows


def plot(rows: list[dict], out: Path, budget_ms: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    combos = sorted({(r["variant"], r["scenario"]) for r in rows})
    for variant, scenario in combos:
        sel = [r for r in rows if r["variant"] == variant and r["scenario"] == scenario]
        sel.sort(key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in sel]
        style = "--" if scenario == "generating" else "-"
        ax1.plot(xs, [r["p99"] for r in sel], style, marker="o", label=f"{variant}, {scenario}")
        ax2.plot(xs, [r["tier1_mean"] for r in sel], style, marker="o", label=f"tier1 {variant}, {scenario}")
        ax2.plot(xs, [r["tier2_mean"] for r in sel], style, marker="x", label=f"tier2 {variant}, {scenario}")
    ax1.axhline(budget_ms, color="grey", lw=1)
    ax1.axhline(budget_ms + 5, color="red", lw=1, ls=":")
    ax1.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="retrieval+rerank p99, server (ms)")
    ax1.set_title(f"p99 vs budget {budget_ms:.0f} ms (red: +5 ms)")
    ax2.set(xscale="log", xlabel="concurrency", ylabel="mean pairs scored")
    for ax in (ax1, ax2):
        ax.set_xticks([1, 2, 4, 8], labels=["1", "2", "4", "8"])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax1.yaxis.set_major_formatter(ScalarFormatter())
    ax1.yaxis.set_minor_formatter(ScalarFormatter())
    ax2.set_title("achieved depth per tier")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    path = out / "rerank_latency.png"
    fig.savefig(path, dpi=110)
    return path


def markdown(rows: list[dict]) -> str:
    head = (
        "| variant | load | conc | n | p50 ms | p95 ms | p99 ms | >75 ms | embed+search p50 | rerank p50 | rerank p99 "
        "| tier1 depth (mean) | tier2 depth (mean) | tier2 ran | skipped | load avg |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['scenario']} | {r['concurrency']} | {r['n']} | {r['p50']:.1f} | {r['p95']:.1f} "
            f"| {r['p99']:.1f} | {r['over_budget_plus_5']:.1%} | {r['embed_search_p50']:.1f} | {r['rerank_p50']:.1f} "
            f"| {r['rerank_p99']:.1f} "
            f"| {r['tier1_mean']:.1f} | {r['tier2_mean']:.1f} "
            f"| {r['tier2_ran']:.0%} | {r['skipped']:.0%} | {r['load_avg']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="SciFact index root (holds CURRENT)")
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "rerank")
    parser.add_argument("--models", type=Path, default=None, help="where the test models go (default: a temp dir)")
    parser.add_argument("--variants", default="budget,fixed,budget-pinned")
    parser.add_argument("--scenarios", default="idle,generating")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests", type=int, default=200, help="Retrieve calls per concurrency level")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--load-streams", type=int, default=2, help="concurrent Query streams in 'generating'")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--budget-ms", type=float, default=70.0)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.scenarios = args.scenarios.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    qs = queries(args.corpus)

    work = Path(tempfile.mkdtemp(prefix="bench-rerank-"))
    models = build_all(args.models or work / "models")
    env = {
        **BASE_ENV,
        "RAGSERVE_RERANK_TIER1_MODEL": str(models["minilm-l2-random"]),
        "RAGSERVE_RERANK_TIER2_MODEL": str(models["minilm-l6-random"]),
        "RAGSERVE_RERANK_ONNX_CACHE_DIR": str(work / "onnx"),
        "RAGSERVE_RETRIEVAL_BUDGET_MS": str(int(args.budget_ms)),
    }
    print(f"load average at start: {load_avg()}; cpus: {os.cpu_count()}", flush=True)
    rows: list[dict] = []
    for variant in args.variants.split(","):
        process, target = start_server(args.index, {**env, **VARIANTS[variant]}, args.out / f"server-{variant}.log")
        try:
            rows += asyncio.run(drive(target, variant, args, qs))
        finally:
            stop_server(process)
    print(f"load average at end: {load_avg()}", flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    table = markdown(rows)
    (args.out / "results.md").write_text(table + "\n")
    print(table)
    print(f"plot: {plot(rows, args.out, args.budget_ms)}")


if __name__ == "__main__":
    main()
