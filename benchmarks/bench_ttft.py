"""Time to first token over gRPC on SQuAD v2 dev: the previous engine defaults against each change, side by side.

    python benchmarks/bench_ttft.py --out bench-results/ttft --retrieve-under-load     # the full run (hours)
    python benchmarks/bench_ttft.py --out /tmp/ttft-smoke --questions 6 --slow-questions 2 --repeats 3

Indexes `<data>/corpus.jsonl` (173 SQuAD v2 dev paragraphs, BEIR form; `--data`, default
../shared/data/squad2-dev next to the repository; the data is not shipped), then, for each
configuration in turn, starts one real `ragserve serve` process on loopback (real MiniLM embedder,
hnswlib + BM25, real vLLM engine with SmolLM2-135M) with that configuration's RAGSERVE_* variables
and asks `<data>/questions.jsonl` through `Query`, one request at a time, temperature 0:

  cold pass    every question of a fixed, seeded subset once (nothing can come from the answer cache);
  repeat pass  the first `--repeats` of them again (prefix cache, retrieval cache, answer cache).

Configurations (`--configs` picks some, by name):
  previous-defaults  what shipped before: bf16, 128-token KV blocks, vLLM's old binding of the engine
                     to one core, whole passages, no answer cache (slow on CPUs without native bf16:
                     it asks only `--slow-questions`)
  float32            as previous-defaults, float32
  +all-cores         + the engine's OpenMP threads on every usable CPU
  +block32           + 32-token KV blocks
  +context-N         + RAGSERVE_CONTEXT_TOKEN_BUDGET=N, for each N in `--context-budgets`
  new-defaults       no overrides: whatever the server now resolves from the host
  spec-off           new-defaults without speculative decoding (its gain and cost, side by side)
  spec-on            prompt-lookup speculation asked for (the engine layout left to the host: on a CPU,
                     the engine on a server thread)
  spec-on-process    speculation with vLLM's engine-core process (the layout where it measured slower)
  spec-off-thread    plain decoding with the engine on a server thread (the layout's own effect)

`--workload summary` asks every question as a request for a summary in other words: answers that
do not copy from the passages, where prompt-lookup drafts are rarely accepted.

Reported per configuration: client-side TTFT (request sent -> first token event) p50/p95/p99, the
server's ttft_ms, repeat TTFT and answer-cache hits, prompt / prefix-cached / passage tokens, time
to the whole answer, time per output token, whether the gold paragraph reached the prompt, whether
the answer contains a gold span (SQuAD normalization), and whether unanswerable questions are
declined. With `--retrieve-under-load`, the new-defaults server also runs Retrieve at concurrency 1
and 4 while one Query stream keeps the generator busy (server-side retrieval_total_ms).
Written to `--out`: results.md, results.json (every request), ttft.png, server-<config>.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import math
import os
import random
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import build_index, load_avg, percentile, start_server, stop_server  # noqa: E402
from benchmarks.workloads import (  # noqa: E402
    ABSTAIN_PATTERNS,
    WARMUP,
    Question,
    build_all,
    contains_gold,
    declines,
    load_questions,
)
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import cpu_list, read_host_cpu  # noqa: E402

# Flags that decide the engine's dtype and speed on a CPU, named next to every figure.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
# Configurations that ask only --slow-questions (bf16 is emulated, ~15 s an answer, on AVX2-only CPUs).
SLOW = {"previous-defaults"}
# Per-request server logs (one line per answer) land in the out dir next to the results.
SERVER_ENV = {"RAGSERVE_LOG_LEVEL": "INFO"}


def configurations(context_budgets: list[int]) -> dict[str, dict[str, str]]:
    previous = {
        # "auto" now resolves from the host: the old behaviour (vLLM's bf16) has to be asked for.
        "RAGSERVE_GENERATOR_DTYPE": "bfloat16",
        "RAGSERVE_GENERATOR_BLOCK_SIZE": "128",
        # vLLM's old auto binding on a 2-core host: the engine on one core.
        "RAGSERVE_GENERATOR_CPU_OMP_THREADS_BIND": "0",
        "RAGSERVE_CONTEXT_TOKEN_BUDGET": "0",
        "RAGSERVE_CACHE_ANSWERS": "false",
        "RAGSERVE_GENERATOR_SPECULATIVE": "off",
    }
    float32 = {**previous, "RAGSERVE_GENERATOR_DTYPE": "float32"}
    all_cores = {**float32, "RAGSERVE_GENERATOR_CPU_OMP_THREADS_BIND": cpu_list(tuple(os.sched_getaffinity(0)))}
    block32 = {**all_cores, "RAGSERVE_GENERATOR_BLOCK_SIZE": "32"}
    configs = {"previous-defaults": previous, "float32": float32, "+all-cores": all_cores, "+block32": block32}
    for budget in context_budgets:
        configs[f"+context-{budget}"] = {**block32, "RAGSERVE_CONTEXT_TOKEN_BUDGET": str(budget)}
    configs["new-defaults"] = {}
    # The new defaults but plain decoding: speculation's cost or gain, side by side.
    configs["spec-off"] = {"RAGSERVE_GENERATOR_SPECULATIVE": "off"}
    configs["spec-on"] = {"RAGSERVE_GENERATOR_SPECULATIVE": "ngram"}
    configs["spec-on-process"] = {**configs["spec-on"], "RAGSERVE_GENERATOR_ENGINE_LAYOUT": "process"}
    configs["spec-off-thread"] = {**configs["spec-off"], "RAGSERVE_GENERATOR_ENGINE_LAYOUT": "thread"}
    return configs


@dataclass
class Answer:
    qid: str
    phase: str  # "warmup", "cold" or "repeat"
    impossible: bool
    ok: bool = False
    code: str = "OK"
    client_ttft_ms: float | None = None  # request sent -> first token event, client clock
    client_total_ms: float | None = None  # request sent -> end of stream
    server_ttft_ms: float | None = None
    server_total_ms: float | None = None
    tpot_ms: float | None = None
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    retrieval_ms: float | None = None
    context_ms: float | None = None
    answer_cache_ms: float | None = None
    retrieval_cache_hit: bool = False
    answer_cache_hit: bool = False
    prompt_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    completion_tokens: int = 0
    context_tokens: int = 0
    context_tokens_full: int = 0
    finish_reason: str = ""
    retrieved: list[str] = field(default_factory=list)
    gold_retrieved: bool | None = None
    contains_gold: bool | None = None
    declined: bool | None = None
    answer: str = ""


SUMMARY_REQUEST = "In your own words, without quoting the passages, briefly summarize what they say about this: "


async def ask(
    client: RagClient, q: Question, phase: str, max_tokens: int, timeout_s: float, workload: str = "squad"
) -> Answer:
    out = Answer(q.id, phase, q.impossible)
    parts: list[str] = []
    started = time.perf_counter()
    text = SUMMARY_REQUEST + q.question if workload == "summary" else q.question
    try:
        async for event in client.query(text, max_tokens=max_tokens, temperature=0.0, timeout_s=timeout_s):
            kind = event.WhichOneof("event")
            if kind == "retrieval":
                out.retrieval_ms = event.retrieval.timings.retrieval_total_ms
                out.retrieval_cache_hit = event.retrieval.cache_hit
                out.retrieved = [p.doc_id for p in event.retrieval.passages]
            elif kind == "token":
                if out.client_ttft_ms is None:
                    out.client_ttft_ms = (time.perf_counter() - started) * 1000.0
                parts.append(event.token.text)
            elif kind == "final":
                final = event.final
                out.server_ttft_ms = final.timings.ttft_ms or None
                out.server_total_ms = final.timings.total_ms
                out.tpot_ms = final.timings.time_per_output_token_ms or None
                out.context_ms = final.timings.context_ms
                out.answer_cache_ms = final.timings.answer_cache_ms
                out.answer_cache_hit = final.answer_cache_hit
                out.prompt_tokens = final.usage.prompt_tokens
                out.prefix_cache_hit_tokens = final.usage.prefix_cache_hit_tokens
                out.completion_tokens = final.usage.completion_tokens
                out.draft_tokens = final.usage.draft_tokens
                out.accepted_draft_tokens = final.usage.accepted_draft_tokens
                out.context_tokens = final.usage.context_tokens
                out.context_tokens_full = final.usage.context_tokens_full
                out.finish_reason = final.finish_reason
        out.ok = True
    except grpc.aio.AioRpcError as exc:
        out.code = exc.code().name
    out.client_total_ms = (time.perf_counter() - started) * 1000.0
    out.answer = "".join(parts)
    if out.ok:
        out.declined = declines(out.answer)
        if not q.impossible:
            out.gold_retrieved = q.doc_id in out.retrieved
            out.contains_gold = contains_gold(out.answer, q.answers)
    return out


def tier_depth(tiers: list[str], name: str) -> float:
    """Pairs a tier scored, from RetrieveResponse.rerank_tiers ("tier1:12"); 0 when it did not run."""
    for tier in tiers:
        tier_name, _, depth = tier.partition(":")
        if tier_name == name:
            return float(depth)
    return 0.0


def recased(qs: list[Question], seed: int) -> Iterator[str]:
    """Endless Retrieve queries: the questions with each letter's case drawn at random.

    The retrieval cache key keeps the query's case; the embedder (uncased MiniLM), BM25 (lower-cased
    tokens) and the cross-encoders (the same uncased vocabulary) do not. So every call is a cache miss
    doing the same work as the question itself, even for questions already asked through Query.
    """
    rng = random.Random(seed)
    for i in itertools.count():
        yield "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in qs[i % len(qs)].question)


@dataclass
class RetrieveSample:
    concurrency: int
    ok: bool
    code: str = "OK"
    server_ms: float = 0.0  # timings.retrieval_total_ms
    client_ms: float = 0.0
    cache_hit: bool = False
    rerank_ms: float = 0.0
    rerank_skipped: bool = False
    rerank_tiers: list[str] = field(default_factory=list)  # e.g. ["tier1:12", "tier2:5"]; empty: none ran


async def keep_generating(
    client: RagClient, qs: list[Question], max_tokens: int, stats: dict[str, int], busy: asyncio.Event
) -> None:
    """One Query stream at all times. Each question gets a unique suffix: never an answer-cache hit."""
    for i in itertools.count():
        text = f"{qs[i % len(qs)].question} (background {i})"
        try:
            async for event in client.query(text, max_tokens=max_tokens, temperature=0.0, timeout_s=600):
                if event.WhichOneof("event") == "token":
                    busy.set()
                elif event.WhichOneof("event") == "final" and event.final.answer_cache_hit:
                    stats["answer_cache_hits"] += 1
            stats["completed"] += 1
        except grpc.aio.AioRpcError:
            stats["failed"] += 1


async def retrieve_worker(
    client: RagClient, texts: Iterator[str], until: float, concurrency: int, level: list[RetrieveSample]
) -> None:
    """Closed loop: the next Retrieve as soon as the previous one returns, until the clock says stop."""
    while time.perf_counter() < until:
        sample = RetrieveSample(concurrency, False)
        t0 = time.perf_counter()
        try:
            r = await client.retrieve(next(texts), timeout_s=30)
            sample.ok, sample.server_ms, sample.cache_hit = True, r.timings.retrieval_total_ms, r.cache_hit
            sample.rerank_ms, sample.rerank_skipped = r.timings.rerank_ms, r.degraded.rerank_skipped
            sample.rerank_tiers = list(r.rerank_tiers)
        except grpc.aio.AioRpcError as exc:
            sample.code = exc.code().name
        sample.client_ms = (time.perf_counter() - t0) * 1000.0
        level.append(sample)


async def retrieve_under_load(
    client: RagClient, qs: list[Question], args: argparse.Namespace, reranker: bool
) -> tuple[list[dict[str, Any]], list[RetrieveSample]]:
    texts = recased(qs, args.seed)
    rows: list[dict[str, Any]] = []
    samples: list[RetrieveSample] = []
    stats = {"completed": 0, "failed": 0, "answer_cache_hits": 0}
    busy = asyncio.Event()
    background = asyncio.create_task(keep_generating(client, qs[::-1], args.max_tokens, stats, busy))
    try:
        await asyncio.wait_for(busy.wait(), 300)  # the generator is producing tokens
        for concurrency in args.load_concurrency:
            before = dict(stats)
            level: list[RetrieveSample] = []
            until = time.perf_counter() + args.load_seconds

            await asyncio.gather(
                *(retrieve_worker(client, texts, until, concurrency, level) for _ in range(concurrency))
            )
            samples += level
            measured = [s for s in level if s.ok and not s.cache_hit]
            misses = [s.server_ms for s in measured]
            row = {
                "concurrency": concurrency,
                "seconds": args.load_seconds,
                "n": len(misses),
                "cache_hits_excluded": sum(s.ok and s.cache_hit for s in level),
                "errors": sum(not s.ok for s in level),
                "p50": percentile(misses, 50),
                "p95": percentile(misses, 95),
                "p99": percentile(misses, 99),
                "max": max(misses, default=float("nan")),
                "over_75": sum(v > 75.0 for v in misses) / max(1, len(misses)),
                "reranker": reranker,
                "tier1_depth_mean": mean([tier_depth(s.rerank_tiers, "tier1") for s in measured]),
                "tier2_depth_mean": mean([tier_depth(s.rerank_tiers, "tier2") for s in measured]),
                "rerank_skipped": sum(s.rerank_skipped for s in measured) / max(1, len(measured)),
                "background_queries_completed": stats["completed"] - before["completed"],
                "background_queries_failed": stats["failed"] - before["failed"],
                "background_answer_cache_hits": stats["answer_cache_hits"] - before["answer_cache_hits"],
                "load_avg": load_avg(),
            }
            rows.append(row)
            print(
                f"  Retrieve under load, c={concurrency}: n={row['n']} p50={row['p50']:.1f} p95={row['p95']:.1f} "
                f"p99={row['p99']:.1f} ms (server); background Query calls completed "
                f"{row['background_queries_completed']}; load {row['load_avg']}",
                flush=True,
            )
    finally:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
    return rows, samples


async def drive(name: str, target: str, qs: list[Question], args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Fills `result` as it goes: a configuration that fails half-way keeps the answers it got."""
    async with RagClient(target, default_timeout_s=60) as client:
        info = await client.info()
        result["info"] = {
            "host_cpu": info.host_cpu,
            "generator_model": info.generator_model,
            "index_version": info.index_version,
            "index_chunks": info.index_chunks,
            "rerank_tiers": list(info.rerank_tiers),
            "generator_settings": [
                {"name": s.name, "value": s.value, "reason": s.reason} for s in info.generator_settings
            ],
        }
        print(f"[{name}] host: {info.host_cpu}", flush=True)
        for s in info.generator_settings:
            print(f"[{name}]   {s.name} = {s.value}  ({s.reason})", flush=True)

        answers: list[Answer] = []
        result["answers"] = answers
        for _ in range(args.warmup):  # first-request costs stay out of the figures
            answers.append(await ask(client, WARMUP, "warmup", args.max_tokens, args.timeout))

        t0 = time.perf_counter()
        for i, q in enumerate(qs, start=1):
            answers.append(await ask(client, q, "cold", args.max_tokens, args.timeout, args.workload))
            if i % args.progress_every == 0 or i == len(qs):
                ttfts = [a.client_ttft_ms for a in answers if a.phase == "cold" and a.client_ttft_ms is not None]
                print(
                    f"[{name}] cold {i}/{len(qs)}: TTFT p50 {percentile(ttfts, 50):.0f} ms; "
                    f"{time.perf_counter() - t0:.0f} s; load {load_avg()}",
                    flush=True,
                )
        result["cold_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        for q in qs[: args.repeats]:
            answers.append(await ask(client, q, "repeat", args.max_tokens, args.timeout, args.workload))
        result["repeat_s"] = time.perf_counter() - t0
        repeat_ttft = [a.client_ttft_ms for a in answers if a.phase == "repeat" and a.client_ttft_ms is not None]
        print(
            f"[{name}] repeat {min(args.repeats, len(qs))}: TTFT p50 {percentile(repeat_ttft, 50):.0f} ms", flush=True
        )

        if args.retrieve_under_load and name in args.load_configs.split(","):
            t0 = time.perf_counter()
            result["retrieve_under_load"], result["retrieve_samples"] = await retrieve_under_load(
                client, qs, args, reranker=bool(info.rerank_tiers)
            )
            result["load_s"] = time.perf_counter() - t0


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def share(flags: list[bool | None]) -> tuple[float, int]:
    known = [f for f in flags if f is not None]
    return (sum(known) / len(known) if known else float("nan")), len(known)


def same_answers(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Greedy answers of each other configuration against spec-off (plain decoding), question by question."""
    if "spec-off" not in runs:
        return []

    def cold(run: dict[str, Any]) -> dict[str, str]:
        return {a.qid: a.answer for a in run.get("answers", []) if a.phase == "cold" and a.ok}

    off = cold(runs["spec-off"])
    lines: list[str] = []
    for name in ("new-defaults", "spec-on", "spec-on-process", "spec-off-thread"):
        if name not in runs:
            continue
        on = cold(runs[name])
        both = sorted(set(on) & set(off))
        differ = [qid for qid in both if on[qid] != off[qid]]
        lines += ["", f"Greedy answers identical, {name} vs spec-off: {len(both) - len(differ)}/{len(both)}."]
        for qid in differ[:10]:
            lines += [f"- `{qid}` {name}: {on[qid][:160]!r}", f"  spec-off: {off[qid][:160]!r}"]
    return lines


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    answers: list[Answer] = run.get("answers", [])
    cold = [a for a in answers if a.phase == "cold"]
    repeat = [a for a in answers if a.phase == "repeat"]
    ok = [a for a in cold if a.ok]
    rep_ok = [a for a in repeat if a.ok]

    def values(rows: list[Answer], attr: str) -> list[float]:
        return [float(v) for v in (getattr(a, attr) for a in rows) if v is not None]

    s: dict[str, Any] = {"n": len(cold), "errors": len(cold) - len(ok), "repeat_n": len(repeat)}
    s["repeat_errors"] = len(repeat) - len(rep_ok)
    for attr, key in (("client_ttft_ms", "ttft"), ("server_ttft_ms", "server_ttft"), ("client_total_ms", "total")):
        for q in (50, 95, 99):
            s[f"{key}_p{q}"] = percentile(values(ok, attr), q)
    s["tpot_p50"] = percentile(values(ok, "tpot_ms"), 50)
    s["tpot_p95"] = percentile(values(ok, "tpot_ms"), 95)
    drafted = sum(a.draft_tokens for a in ok)
    s["acceptance"] = sum(a.accepted_draft_tokens for a in ok) / drafted if drafted else float("nan")
    s["retrieval_p50"] = percentile(values(ok, "retrieval_ms"), 50)
    s["repeat_ttft_p50"] = percentile(values(rep_ok, "client_ttft_ms"), 50)
    s["repeat_ttft_p95"] = percentile(values(rep_ok, "client_ttft_ms"), 95)
    s["repeat_answer_cache_hits"] = sum(a.answer_cache_hit for a in rep_ok)
    s["repeat_retrieval_cache_hits"] = sum(a.retrieval_cache_hit for a in rep_ok)
    s["cold_answer_cache_hits"] = sum(a.answer_cache_hit for a in ok)  # must stay 0
    for attr in (
        "prompt_tokens",
        "prefix_cache_hit_tokens",
        "context_tokens",
        "context_tokens_full",
        "completion_tokens",
    ):
        s[f"{attr}_mean"] = mean(values(ok, attr))
    s["repeat_prefix_cache_hit_tokens_mean"] = mean(values(rep_ok, "prefix_cache_hit_tokens"))
    answerable = [a for a in ok if not a.impossible]
    impossible = [a for a in ok if a.impossible]
    s["gold_retrieved"], s["answerable_n"] = share([a.gold_retrieved for a in answerable])
    s["contains_gold"], _ = share([a.contains_gold for a in answerable])
    s["answerable_declined"], _ = share([a.declined for a in answerable])
    s["impossible_declined"], s["impossible_n"] = share([a.declined for a in impossible])
    return s


def fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(meta: dict[str, Any], runs: dict[str, dict[str, Any]]) -> str:
    out = [
        "# Time to first token: SQuAD v2 dev over gRPC",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- CPU: {meta['cpu_model']}; {meta['cpus']} usable CPUs ({meta['cpu_list']}); flags: {meta['cpu_flags']}",
        f"- load average (1/5/15 min) at start: {meta['load_start']}; at end: {meta.get('load_end', '-')}",
        f"- data: `{meta['data']}` ({meta['corpus_docs']} paragraphs); questions: {meta['questions']} of "
        f"{meta['questions_total']} (seed {meta['seed']}; {meta['slow_questions']} for {', '.join(sorted(SLOW))}), "
        f"then the first {meta['repeats']} again",
        f"- Query: max_tokens {meta['max_tokens']}, temperature 0, top_k and retrieval budget: server defaults; "
        "one request at a time, one server process per configuration, one configuration after another; "
        f"every server also gets {' '.join(f'{k}={v}' for k, v in SERVER_ENV.items())} (logs only)",
    ]
    if meta.get("rerank_models"):
        out.append(
            f"- reranker: two-tier **random-head test models** from `{meta['rerank_models']}` in every configuration: "
            "the gold-paragraph and answer columns do not measure the product's quality in this run"
        )
    if meta.get("inherited_env"):
        out.append(f"- inherited from the environment by every server: `{meta['inherited_env']}`")

    rows = []
    for name, run in runs.items():
        env = " ".join(f"{k.removeprefix('RAGSERVE_')}={v}" for k, v in run["env"].items()) or "(none)"
        if run.get("error"):
            env += f"; **failed**: {run['error']} (see server-{name}.log)"
        s = run.get("summary", {})
        n, r = s.get("n", 0), s.get("repeat_n", 0)
        cold_s, repeat_s = run.get("cold_s"), run.get("repeat_s")
        rows.append(
            [
                name,
                env,
                fmt(run.get("startup_s")),
                fmt(cold_s),
                fmt(cold_s / n if cold_s and n else None, 1),
                fmt(repeat_s),
                fmt(repeat_s / r if repeat_s and r else None, 1),
                run.get("load_end", "-"),
            ]
        )
    header = ["config", "RAGSERVE_* overrides", "start-up s", "cold pass s", "s per question"]
    header += ["repeat pass s", "s per repeat", "load avg after"]
    out += ["", "## Configurations", "", *table(header, rows)]
    out += ["", "Engine settings the server reported (Info.generator_settings; host_cpu as the server saw it):", ""]
    for name, run in runs.items():
        info = run.get("info")
        if info:
            settings = "; ".join(f"{s['name']}={s['value']} ({s['reason']})" for s in info["generator_settings"])
            out.append(f"- **{name}**: {settings or 'none reported'}")
    for host in sorted({run["info"]["host_cpu"] for run in runs.values() if run.get("info")}):
        out.append(f"- host_cpu: {host}")

    summaries = {name: run["summary"] for name, run in runs.items() if run.get("summary")}
    header = ["config", "n", "errors", "TTFT p50", "p95", "p99", "server TTFT p50", "p95", "p99", "repeat n"]
    header += ["repeat TTFT p50", "p95", "repeat answer-cache hits", "answer p50", "p95", "per output token p50", "p95"]
    header += ["draft acceptance"]
    rows = [
        [
            name,
            str(s["n"]),
            str(s["errors"] + s["repeat_errors"]),
            *(fmt(s[f"ttft_p{q}"]) for q in (50, 95, 99)),
            *(fmt(s[f"server_ttft_p{q}"]) for q in (50, 95, 99)),
            str(s["repeat_n"]),
            fmt(s["repeat_ttft_p50"]),
            fmt(s["repeat_ttft_p95"]),
            f"{s['repeat_answer_cache_hits']}/{s['repeat_n']}",
            fmt(s["total_p50"]),
            fmt(s["total_p95"]),
            fmt(s["tpot_p50"], 1),
            fmt(s["tpot_p95"], 1),
            pct(s["acceptance"]) if s["acceptance"] == s["acceptance"] else "-",
        ]
        for name, s in summaries.items()
    ]
    out += ["", "## Latency (ms, client side unless marked server; cold pass unless marked repeat)", ""]
    out += table(header, rows)
    cold_hits = {name: s["cold_answer_cache_hits"] for name, s in summaries.items() if s["cold_answer_cache_hits"]}
    out += ["", f"Answer-cache hits in the cold passes: {cold_hits or 'none'} (each question is asked once there)."]
    out += same_answers(runs)

    header = ["config", "prompt", "prefix-cache hit", "repeat: prefix-cache hit", "passage tokens in prompt"]
    header += ["whole passages", "completion"]
    rows = [
        [
            name,
            *(
                fmt(s[key])
                for key in (
                    "prompt_tokens_mean",
                    "prefix_cache_hit_tokens_mean",
                    "repeat_prefix_cache_hit_tokens_mean",
                    "context_tokens_mean",
                    "context_tokens_full_mean",
                    "completion_tokens_mean",
                )
            ),
        ]
        for name, s in summaries.items()
    ]
    out += ["", "## Tokens (means per request, cold pass unless marked repeat)", "", *table(header, rows)]

    header = ["config", "answerable", "gold paragraph in the prompt", "answer contains a gold span"]
    header += ["answerable but declined", "unanswerable", "declined"]
    rows = [
        [
            name,
            str(s["answerable_n"]),
            pct(s["gold_retrieved"]),
            pct(s["contains_gold"]),
            pct(s["answerable_declined"]),
            str(s["impossible_n"]),
            pct(s["impossible_declined"]),
        ]
        for name, s in summaries.items()
    ]
    out += ["", "## Answers (cold pass)", "", *table(header, rows)]
    out += [
        "",
        "Gold span: SQuAD normalization of answer and span (lower-case, punctuation and a/an/the removed, spaces "
        "collapsed), the span found as whole words. Declined: the lower-cased answer matches one of",
        "",
        *(f"- `{p}`" for p in ABSTAIN_PATTERNS),
    ]

    load_rows = [(name, row) for name, run in runs.items() for row in run.get("retrieve_under_load", [])]
    if load_rows:
        header = ["config", "concurrency", "seconds", "n", "cache hits left out", "errors", "p50", "p95", "p99", "max"]
        header += ["> 75 ms", "tier1 depth", "tier2 depth", "rerank skipped", "background Queries done", "load avg"]
        rows = [
            [
                name,
                str(row["concurrency"]),
                f"{row['seconds']:.0f}",
                str(row["n"]),
                str(row["cache_hits_excluded"]),
                str(row["errors"]),
                *(fmt(row[key], 1) for key in ("p50", "p95", "p99", "max")),
                f"{row['over_75']:.1%}",
                *(
                    (fmt(row["tier1_depth_mean"], 1), fmt(row["tier2_depth_mean"], 1), f"{row['rerank_skipped']:.0%}")
                    if row["reranker"]
                    else ("no reranker", "-", "-")
                ),
                str(row["background_queries_completed"]),
                row["load_avg"],
            ]
            for name, row in load_rows
        ]
        out += [
            "",
            "## Retrieve under load (server-side retrieval_total_ms, retrieval-cache misses only)",
            "",
            "One Query stream generating at all times. Acceptance: p99 <= 75 ms at concurrency 1 and 4.",
            "",
            *table(header, rows),
        ]
    return "\n".join(out) + "\n"


def plot(runs: dict[str, dict[str, Any]], out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in runs.items() if r.get("answers")]
    if not names:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 1.6 * len(names) + 4), 5), sharey=True)
    for ax, phase, title in ((axes[0], "cold", "first ask"), (axes[1], "repeat", "same question again")):
        data = [
            [a.client_ttft_ms for a in runs[n]["answers"] if a.phase == phase and a.client_ttft_ms is not None]
            or [math.nan]
            for n in names
        ]
        ax.boxplot(data, whis=(5, 95), showfliers=True)
        ax.set_xticks(range(1, len(names) + 1), labels=names, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"client TTFT, {title} (whiskers p5-p95)")
        ax.grid(alpha=0.3, which="both", axis="y")
    axes[0].set_ylabel("ms (log scale)")
    cpu = read_host_cpu()
    fig.suptitle(f"ragserve Query TTFT on SQuAD v2 dev, SmolLM2-135M on vLLM CPU ({cpu.model}, {len(cpu.cpus)} CPUs)")
    fig.tight_layout()
    path = out / "ttft.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def no_nan(value: Any) -> Any:
    """NaN (no values) as null: strict JSON readers reject NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    return value


def write_results(meta: dict[str, Any], runs: dict[str, dict[str, Any]], out: Path) -> str:
    table = markdown(meta, runs)
    (out / "results.md").write_text(table)
    serial = {
        "meta": meta,
        "abstain_patterns": list(ABSTAIN_PATTERNS),
        "configs": {
            name: {
                **{k: v for k, v in run.items() if k not in ("answers", "retrieve_samples")},
                "answers": [asdict(a) for a in run.get("answers", [])],
                "retrieve_samples": [asdict(s) for s in run.get("retrieve_samples", [])],
            }
            for name, run in runs.items()
        },
    }
    (out / "results.json").write_text(json.dumps(no_nan(serial), indent=1, default=str))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "data" / "squad2-dev",
        help="folder with corpus.jsonl and questions.jsonl (default: ../shared/data/squad2-dev)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "ttft")
    parser.add_argument("--index", type=Path, help="an index root of the corpus; default: built into OUT/index")
    parser.add_argument("--configs", help="comma-separated names (default: all); see the list above")
    parser.add_argument("--context-budgets", default="96,128,192", help="one +context-N configuration for each")
    parser.add_argument("--questions", type=int, default=0, help="questions per configuration (default 0: all)")
    parser.add_argument(
        "--slow-questions",
        type=int,
        default=20,
        help=f"questions for {', '.join(sorted(SLOW))} (a prefix of the others'; 0: as many as the others)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="questions asked a second time")
    parser.add_argument("--seed", type=int, default=13, help="order of the questions (the subset is a prefix)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--workload", choices=["squad", "summary"], default="squad", help="summary: answers in other words"
    )
    parser.add_argument("--warmup", type=int, default=1, help="Query calls before measuring (not reported)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per Query call")
    parser.add_argument("--progress-every", type=int, default=25)
    parser.add_argument(
        "--retrieve-under-load",
        action="store_true",
        help="the --load-configs servers: Retrieve at --load-concurrency while one Query stream runs",
    )
    parser.add_argument(
        "--config",
        dest="extra_config",
        action="append",
        default=[],
        help="one more configuration, NAME:RAGSERVE_X=V[,RAGSERVE_Y=W] (may be repeated; list it in --configs)",
    )
    parser.add_argument("--load-configs", default="new-defaults", help="comma-separated configuration names")
    parser.add_argument("--load-concurrency", default="1,4")
    parser.add_argument("--load-seconds", type=float, default=60.0, help="per concurrency level")
    parser.add_argument(
        "--rerank-models",
        type=Path,
        help="two-tier reranker with the random-head TEST models built (or reused) in this folder, "
        "in every configuration (latency only: ranking becomes meaningless)",
    )
    args = parser.parse_args()
    args.load_concurrency = [int(c) for c in args.load_concurrency.split(",")]

    all_configs = configurations([int(b) for b in args.context_budgets.split(",") if b])
    for extra in args.extra_config:
        name, _, assignments = extra.partition(":")
        pairs = [item.partition("=") for item in assignments.split(",") if item]
        if not name or any(not key.startswith("RAGSERVE_") or not sep for key, sep, _ in pairs):
            parser.error(f"--config {extra!r}: expected NAME:RAGSERVE_X=V[,RAGSERVE_Y=W]")
        all_configs[name] = {key: value for key, _, value in pairs}
    names = args.configs.split(",") if args.configs else list(all_configs)
    unknown = [n for n in names if n not in all_configs]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {', '.join(all_configs)}")
    for path in (args.data / "corpus.jsonl", args.data / "questions.jsonl"):
        if not path.is_file():
            parser.error(f"{path} not found (--data)")
    args.out.mkdir(parents=True, exist_ok=True)

    qs_all = load_questions(args.data, args.seed)
    qs = qs_all[: args.questions] if args.questions > 0 else qs_all
    cpu = read_host_cpu()
    common: dict[str, str] = {}
    if args.rerank_models:
        models = build_all(args.rerank_models.resolve())
        common = {
            "RAGSERVE_RERANK_MODE": "two-tier",
            "RAGSERVE_RERANK_TIER1_MODEL": str(models["minilm-l2-random"]),
            "RAGSERVE_RERANK_TIER2_MODEL": str(models["minilm-l6-random"]),
            "RAGSERVE_RERANK_ALLOW_RANDOM_HEADS": "true",  # test models: latency only
            "RAGSERVE_RERANK_ONNX_CACHE_DIR": str(args.rerank_models.resolve() / "onnx"),
        }
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "cpu_model": cpu.model,
        "cpus": len(cpu.cpus),
        "cpu_list": cpu_list(cpu.cpus),
        "cpu_flags": ", ".join(f"{f} {'yes' if f in cpu.flags else 'no'}" for f in CPU_FLAGS),
        "load_start": load_avg(),
        "data": str(args.data),
        "corpus_docs": sum(1 for line in (args.data / "corpus.jsonl").open() if line.strip()),
        "questions": len(qs),
        "questions_total": len(qs_all),
        "slow_questions": min(args.slow_questions, len(qs)) if args.slow_questions > 0 else len(qs),
        "repeats": args.repeats,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "rerank_models": str(args.rerank_models) if args.rerank_models else "",
        "inherited_env": " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("RAGSERVE_")),
        "configs": names,
    }
    print(f"CPU: {cpu.model}; {len(cpu.cpus)} CPUs; {meta['cpu_flags']}; load average {meta['load_start']}", flush=True)

    index = args.index
    if index is None:
        index = args.out / "index"
        build_index(args.data / "corpus.jsonl", index)

    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        env = all_configs[name]
        run: dict[str, Any] = {"env": env}
        runs[name] = run
        subset = qs[: args.slow_questions] if name in SLOW and args.slow_questions > 0 else qs
        print(f"[{name}] starting: {' '.join(f'{k}={v}' for k, v in env.items()) or 'no overrides'}", flush=True)
        t0 = time.perf_counter()
        try:
            process, target = start_server(index, {**SERVER_ENV, **common, **env}, args.out / f"server-{name}.log")
        except SystemExit as exc:  # one configuration that cannot start does not lose the others
            run["error"] = str(exc).splitlines()[0]
            print(f"[{name}] {exc}", flush=True)
            continue
        run["startup_s"] = time.perf_counter() - t0
        try:
            asyncio.run(drive(name, target, subset, args, run))
        except Exception as exc:  # e.g. a dead engine: keep the configurations already measured
            run["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"[{name}] failed: {run['error']}", flush=True)
        finally:
            stop_server(process)
        run["load_end"] = load_avg()
        run["summary"] = summarize(run)
        write_results(meta, runs, args.out)  # after every configuration: a long run keeps what it has

    meta["load_end"] = load_avg()
    table = write_results(meta, runs, args.out)
    print()
    print(table)
    print(f"plot: {plot(runs, args.out)}")
    print(f"results: {args.out / 'results.md'}, {args.out / 'results.json'}; server logs: {args.out}/server-*.log")


if __name__ == "__main__":
    main()
