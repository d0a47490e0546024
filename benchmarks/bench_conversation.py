"""Conversations and the OpenAI door, on one real server (engine in process, answer cache off):

1. Follow-ups: is the gold paragraph the top passage of a follow-up question, with the conversation's
   history and without it (the same follow-ups, the same server, one run)? And the first question of
   each conversation, which carries no history.
2. TTFT through the OpenAI-compatible HTTP door (the official `openai` package, streaming) against
   gRPC (ragserve's client), each question asked through both, the order alternating.
3. What the quoted history costs the prompt: follow-ups answered with their history and without it
   over gRPC (TTFT, prompt tokens, prefix-cached tokens), the order alternating.
4. The blend weight (RAGSERVE_HISTORY_QUESTION_WEIGHT), swept in process: the product's pipeline
   without a generator, default settings otherwise, the same follow-ups.

The follow-up set is built from `<data>/questions.jsonl` by one deterministic rule:

- within one paragraph, answerable questions in file order; a later question B is paired with the
  earlier question A of the same paragraph with which it shares the longest phrase (1-4 words,
  lower-cased, a trailing 's dropped; starting and ending on a non-stopword, at least 4 letters, not
  B's first word, found in the questions of at most 2 paragraphs, so it names the paragraph's
  subject, and either 2+ words or a capitalized word in B; ties: the earliest A);
- the follow-up is B with that phrase (and an article before it) replaced by a pronoun: "they" when
  its last word ends in s (not ss, us, is), else "it"; "their"/"its" for a possessive.
  "Who killed Harold II?" then "Where did Harold II die?" becomes "Where did it die?" (the rule is
  mechanical: "it" stands for a person there).
- the history is A and, as the assistant's turn, A's first gold answer span (a stand-in for an
  answer: retrieval reads only the user turns; the prompt quotes both).

Gold at rank 1: the top passage's document is B's paragraph. The top passage is read from the
retrieval event and the call is then cancelled (retrieval only; the engine request is aborted).

    python benchmarks/bench_conversation.py --data ../shared/data/squad2-dev --out /tmp/bench-conversation
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.followups import follow_ups
from benchmarks.harness import (
    REPO,
    ensure_index,
    free_port,
    git_head,
    load_avg,
    percentile,
    start_server,
    stop_server,
    write_results,
)
from ragserve.client import RagClient
from ragserve.generate.host import read_host_cpu


async def top_document(client: RagClient, question: str, history: list[tuple[str, str]]) -> str:
    """The top passage's document, the call cancelled once the retrieval event is in."""
    async for event in client.query(question, max_tokens=1, history=history, timeout_s=120):
        return str(event.retrieval.passages[0].doc_id)
    return ""


async def grpc_ttft(client: RagClient, question: str, max_tokens: int) -> tuple[float, float]:
    """Client-side TTFT and the server's own (from the call's arrival, its final event)."""
    row = await grpc_answer(client, question, max_tokens, [])
    return row["ttft_ms"], row["server_ttft_ms"]


async def grpc_answer(
    client: RagClient, question: str, max_tokens: int, history: list[tuple[str, str]]
) -> dict[str, float]:
    """Client-side TTFT and the final event's prompt and prefix-cached tokens."""
    started = time.perf_counter()
    row = {"ttft_ms": float("nan"), "server_ttft_ms": float("nan"), "prompt_tokens": 0.0, "cached_tokens": 0.0}
    events = client.query(question, max_tokens=max_tokens, temperature=0.0, history=history, timeout_s=300)
    async for event in events:
        kind = event.WhichOneof("event")
        if kind == "token" and row["ttft_ms"] != row["ttft_ms"]:
            row["ttft_ms"] = (time.perf_counter() - started) * 1000.0
        elif kind == "final":
            row["prompt_tokens"] = event.final.usage.prompt_tokens
            row["cached_tokens"] = event.final.usage.prefix_cache_hit_tokens
            row["server_ttft_ms"] = event.final.timings.ttft_ms
    return row


async def sweep(index: Path, conversations: list[dict[str, Any]], weights: list[float]) -> dict[str, list[int]]:
    """Gold at rank 1 per blend weight, in process (1.0: the question's vector alone, while lexical
    search and the reranker still read the question with the turn): [follow-ups with their history,
    topic switches]. A topic switch is a follow-up's original (self-contained) question asked after
    the first question of the conversation half the list away (mostly the other article): what an
    unrelated history costs."""
    from ragserve.budget import Deadline, RequestContext
    from ragserve.config import Settings
    from ragserve.factory import make_pipeline
    from ragserve.types import RetrieveParams

    settings = Settings(index={"path": index}, cache={"backend": "off"}, answer={"generation_enabled": False})
    pipeline = make_pipeline(settings, with_generator=False)
    await pipeline.astart()
    hits: dict[str, list[int]] = {}
    top_k = settings.requests.default_top_k

    async def top(question: str, turn: str, weight: float) -> str:
        params = RetrieveParams(question, top_k, 10_000, recent=(turn,), question_weight=weight)
        found = await pipeline.retrieve(params, RequestContext(Deadline(10_000), "sweep"))
        return found.passages[0].chunk.doc_id

    try:
        for weight in weights:
            hits[f"{weight:g}"] = [0, 0]
            for i, c in enumerate(conversations):
                other = conversations[(i + len(conversations) // 2) % len(conversations)]
                hits[f"{weight:g}"][0] += await top(c["follow_up"], c["first"], weight) == c["paragraph"]
                hits[f"{weight:g}"][1] += await top(c["original"], other["first"], weight) == c["paragraph"]
    finally:
        await pipeline.aclose()
    return hits


async def http_ttft(client: Any, question: str, max_tokens: int) -> tuple[float, float]:
    """Client-side TTFT (the first chunk with content) and the server's own (`ragserve.final`)."""
    started = time.perf_counter()
    ttft = server = float("nan")
    stream = await client.chat.completions.create(
        model="ragserve",
        stream=True,
        max_tokens=max_tokens,
        temperature=0.0,
        messages=[{"role": "user", "content": question}],
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and ttft != ttft:
            ttft = (time.perf_counter() - started) * 1000.0
        final = (chunk.model_extra or {}).get("ragserve", {}).get("final")
        if final is not None:
            server = float(final["timings"].get("ttft_ms", float("nan")))
    return ttft, server


async def run(
    args: argparse.Namespace, target: str, http_url: str, conversations: list[dict[str, Any]]
) -> dict[str, Any]:
    import openai

    questions = [json.loads(line) for line in (args.data / "questions.jsonl").open() if line.strip()]
    asked = [q["question"].strip() for q in questions if not q["impossible"]]
    random.Random(args.seed).shuffle(asked)
    asked = asked[: args.ttft_questions]
    http = openai.AsyncOpenAI(base_url=http_url, api_key="unused", max_retries=0, timeout=300)
    async with RagClient(target, default_timeout_s=300) as client:
        for _ in range(args.warmup):  # first-request costs stay out of the figures
            await grpc_answer(client, "What are these documents about?", args.max_tokens, [])
            await http_ttft(http, "What are these documents about?", args.max_tokens)
        rows = []
        for c in conversations:
            history = [("user", c["first"]), ("assistant", c["first_answer"])]
            rows.append(
                {
                    **c,
                    "first_top": await top_document(client, c["first"], []),
                    "alone_top": await top_document(client, c["follow_up"], []),
                    "history_top": await top_document(client, c["follow_up"], history),
                    "original_top": await top_document(client, c["original"], []),
                }
            )
        cost = []
        for i, c in enumerate(conversations[: args.prompt_conversations]):
            history = [("user", c["first"]), ("assistant", c["first_answer"])]
            for with_history in (True, False) if i % 2 == 0 else (False, True):
                row = await grpc_answer(client, c["follow_up"], args.max_tokens, history if with_history else [])
                cost.append({"follow_up": c["follow_up"], "history": with_history, **row})
        ttft = []
        for i, question in enumerate(asked):
            order = ("grpc", "http") if i % 2 == 0 else ("http", "grpc")
            for position, door in enumerate(order):
                ms, server_ms = await (
                    grpc_ttft(client, question, args.max_tokens)
                    if door == "grpc"
                    else http_ttft(http, question, args.max_tokens)
                )
                first = position == 0
                ttft.append(
                    {"question": question, "door": door, "first": first, "ttft_ms": ms, "server_ttft_ms": server_ms}
                )
    await http.close()
    return {"follow_ups": rows, "ttft": ttft, "prompt_cost": cost}


def _share(rows: list[dict[str, Any]], key: str) -> str:
    hits = sum(r[key] == r["paragraph"] for r in rows)
    return f"{hits}/{len(rows)} ({100.0 * hits / max(1, len(rows)):.1f}%)"


def report(meta: dict[str, Any], results: dict[str, Any]) -> str:
    rows = results["follow_ups"]
    alone = sum(r["alone_top"] == r["paragraph"] for r in rows)
    with_history = sum(r["history_top"] == r["paragraph"] for r in rows)
    lines = [
        f"# Conversations and the OpenAI door ({meta['date']}, commit {meta['commit']})",
        "",
        f"- command: `{meta['command']}`",
        f"- CPU: {meta['cpu']}; load average at start {meta['load_start']}, at end {meta['load_end']}",
        f"- settings: defaults (history: {meta['history']}), answer cache off, max_tokens {meta['max_tokens']}",
        "",
        f"## Follow-ups: gold paragraph at rank 1 ({len(rows)} conversations)",
        "",
        "| question | gold at rank 1 |",
        "|---|---|",
        f"| first question (no history) | {_share(rows, 'first_top')} |",
        f"| follow-up, alone | {_share(rows, 'alone_top')} |",
        f"| follow-up, with the history | {_share(rows, 'history_top')} |",
        f"| the original question (before the rewrite), alone | {_share(rows, 'original_top')} |",
        "",
        f"With history / alone: {with_history / alone:.2f}x" if alone else "alone: none at rank 1",
        "",
    ]
    return "\n".join([*lines, *_ttft_report(results["ttft"]), *_cost_report(results, rows)])


def _ttft_report(asked: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## TTFT, client side (ms): the same questions through both doors, order alternating",
        "",
        "Each question is asked through both doors, one after the other: the second ask finds the whole",
        "prompt in the prefix cache, so first and second asks are reported apart (their mix is bimodal).",
        "Server: the server's own TTFT (from the call's arrival, in the final event). Door: client minus",
        "server per ask, what the protocol and the client library add.",
        "",
        "| door | p50, asked first | p50, asked second | p95 | server p50, first | door p50 | door p95 |",
        "|---|---|---|---|---|---|---|",
    ]
    p50: dict[tuple[str, bool], float] = {}
    for door, name in (("grpc", "gRPC (RagClient)"), ("http", "HTTP (openai package, SSE)")):
        asks = [r for r in asked if r["door"] == door]
        for first in (True, False):
            p50[door, first] = percentile([r["ttft_ms"] for r in asks if r["first"] is first], 50)
        overhead = [r["ttft_ms"] - r["server_ttft_ms"] for r in asks]
        server = percentile([r["server_ttft_ms"] for r in asks if r["first"]], 50)
        lines.append(
            f"| {name} | {p50[door, True]:.0f} | {p50[door, False]:.0f} "
            f"| {percentile([r['ttft_ms'] for r in asks], 95):.0f} | {server:.0f} "
            f"| {percentile(overhead, 50):.1f} | {percentile(overhead, 95):.1f} |"
        )
    by_question: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for r in asked:
        by_question[r["question"]][r["door"]] = r["ttft_ms"]
    paired = [q["http"] / q["grpc"] for q in by_question.values() if len(q) == 2]
    return [
        *lines,
        "",
        f"HTTP / gRPC, client TTFT p50: asked first {p50['http', True] / p50['grpc', True]:.3f}, "
        f"asked second {p50['http', False] / p50['grpc', False]:.3f}; median of the per-question ratios "
        f"{percentile(paired, 50):.3f} ({len(paired)} questions)",
        "",
    ]


def _cost_report(results: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    cost = results["prompt_cost"]
    lines = [
        f"## The quoted history's cost: {len(cost) // 2} follow-ups over gRPC, with and without it",
        "",
        "| follow-up | TTFT p50 (ms) | prompt tokens (mean) | prefix-cached tokens (mean) |",
        "|---|---|---|---|",
    ]
    for with_history in (False, True):
        part = [r for r in cost if r["history"] is with_history]
        mean = lambda key, part=part: sum(r[key] for r in part) / max(1, len(part))  # noqa: E731
        lines.append(
            f"| {'with the history' if with_history else 'alone'} | {percentile([r['ttft_ms'] for r in part], 50):.0f} "
            f"| {mean('prompt_tokens'):.0f} | {mean('cached_tokens'):.0f} |"
        )
    return [
        *lines,
        "",
        "## The blend weight, in process: gold at rank 1",
        "",
        "Topic switch: a self-contained question after an unrelated first question (its own gold at",
        f"rank 1 asked alone, through the server above: {_share(rows, 'original_top')}).",
        "",
        "| question's share of the vector | follow-up with its history | topic switch |",
        "|---|---|---|",
        *(f"| {w} | {hits[0]}/{len(rows)} | {hits[1]}/{len(rows)} |" for w, hits in results["sweep"].items()),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "conversation")
    parser.add_argument("--index", type=Path, help="an index root of the corpus; default: built into OUT/index")
    parser.add_argument("--ttft-questions", type=int, default=80, help="questions asked through both doors")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt-conversations", type=int, default=20, help="follow-ups answered both ways")
    parser.add_argument("--weights", default="1,0.75,0.5,0.25,0", help="blend weights swept in process")
    parser.add_argument("--list", action="store_true", help="print the follow-up set and stop")
    parser.add_argument("--report", type=Path, help="write results.md again from this results.json and stop")
    args = parser.parse_args()
    if args.report is not None:
        saved = json.loads(args.report.read_text())
        write_results(args.report.parent, report(saved["meta"], saved), saved)
        return
    conversations = follow_ups(args.data)
    if args.list:
        for c in conversations:
            print(f"{c['paragraph']}: {c['first']} -> {c['follow_up']}  [{c['phrase']}]")
        print(len(conversations), "follow-ups")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    http_port = free_port()
    env = {"RAGSERVE_OPENAI_PORT": str(http_port), "RAGSERVE_CACHE_BACKEND": "off"}
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_head(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "cpu": read_host_cpu().model,
        "load_start": load_avg(),
        "max_tokens": args.max_tokens,
    }
    from ragserve.config import HistorySettings

    meta["history"] = HistorySettings().model_dump()
    swept = asyncio.run(sweep(index, conversations, [float(w) for w in args.weights.split(",")]))
    print("blend weight -> gold at rank 1:", swept, flush=True)
    process, target = start_server(index, env, args.out / "server.log")
    try:
        results: dict[str, Any] = asyncio.run(run(args, target, f"http://127.0.0.1:{http_port}/v1", conversations))
    finally:
        stop_server(process)
    results["sweep"] = swept
    meta["load_end"] = load_avg()
    write_results(args.out, report(meta, results), {"meta": meta, **results})


if __name__ == "__main__":
    main()
