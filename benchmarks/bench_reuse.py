"""Prompt layouts on recurring documents: TTFT of first visits and revisits, answers, highlights, abstention.

    python benchmarks/bench_reuse.py --out bench-results/reuse
    python benchmarks/bench_reuse.py --out /tmp/reuse-smoke --paragraphs 3 --zipf-questions 20

Indexes `<data>/corpus.jsonl` (SQuAD v2 dev; `--data`, default ../shared/data/squad2-dev; not
shipped), then for each layout and workload starts a fresh `ragserve serve` on loopback (real
embedder, hnswlib + BM25, real vLLM engine; the prefix cache starts empty) with
RAGSERVE_PROMPT_LAYOUT set, and asks through `Query`, one request at a time, temperature 0:

  recurring  every question of `--paragraphs` paragraphs (seeded), shuffled
  zipf       `--zipf-questions` questions; a paragraph drawn with Zipf(`--zipf-s`) popularity, then
             one of its questions not asked yet (no question is asked twice)

The answer cache is off (no question repeats anyway). A request is a *revisit* when the passage
retrieval ranked first was ranked first by an earlier request of the same run, else a *first visit*.

Reported per layout and workload: client TTFT p50/p95 for first visits and revisits (and their
ratio), prompt and prefix-cached tokens, whether the answer holds a gold span, whether the top
passage's highlight holds one (answerable questions), unanswerable questions declined by the
answer, and Support.low against answerability. Writes results.md, results.json, ttft.png to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import ensure_index, load_avg, percentile, start_server, stop_server, write_results  # noqa: E402
from benchmarks.workloads import WARMUP, Question, ask, load_questions, recurring  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402

LAYOUTS = ("stable", "reusable")


def zipf(qs: list[Question], n: int, s: float, seed: int) -> list[Question]:
    rng = random.Random(seed)
    by_doc: dict[str, list[Question]] = {}
    for q in qs:
        by_doc.setdefault(q.doc_id, []).append(q)
    docs = sorted(by_doc)
    rng.shuffle(docs)  # popularity rank independent of the article order
    weights = [1.0 / (rank + 1) ** s for rank in range(len(docs))]
    out: list[Question] = []
    while len(out) < n and any(by_doc.values()):
        doc = rng.choices(docs, weights)[0]
        if by_doc[doc]:
            out.append(by_doc[doc].pop(rng.randrange(len(by_doc[doc]))))
    return out


async def drive(target: str, questions: list[Question], max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    seen: set[str] = set()
    async with RagClient(target, default_timeout_s=120) as client:
        await ask(client, WARMUP, max_tokens)
        for q in questions:
            row = await ask(client, q, max_tokens)
            row["revisit"] = row.get("top_chunk") in seen
            seen.add(row.get("top_chunk", ""))
            rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    first = [r["ttft_ms"] for r in ok if not r["revisit"] and "ttft_ms" in r]
    again = [r["ttft_ms"] for r in ok if r["revisit"] and "ttft_ms" in r]
    answerable = [r for r in ok if not r["impossible"]]
    impossible = [r for r in ok if r["impossible"]]

    def share(items: list[dict[str, Any]], key: str) -> float:
        return sum(bool(r.get(key)) for r in items) / max(1, len(items))

    return {
        "n": len(rows),
        "errors": len(rows) - len(ok),
        "first_n": len(first),
        "revisit_n": len(again),
        "first_p50": percentile(first, 50),
        "first_p95": percentile(first, 95),
        "revisit_p50": percentile(again, 50),
        "revisit_p95": percentile(again, 95),
        "ratio_p50": percentile(again, 50) / percentile(first, 50) if first and again else float("nan"),
        "prompt_p50": percentile([r["prompt_tokens"] for r in ok], 50),
        "cached_first_p50": percentile([r["cached_tokens"] for r in ok if not r["revisit"]], 50),
        "cached_revisit_p50": percentile([r["cached_tokens"] for r in ok if r["revisit"]], 50),
        "total_p50": percentile([r["total_ms"] for r in ok], 50),
        "answer_gold": share(answerable, "answer_gold"),
        "highlight_gold": share(answerable, "highlight_gold"),
        "declined_unanswerable": share(impossible, "declined"),
        "declined_answerable": share(answerable, "declined"),
        "low_support_unanswerable": share(impossible, "support_low"),
        "low_support_answerable": share(answerable, "support_low"),
        "evidence_p50": percentile([r["evidence_ms"] for r in ok], 50),
        "retrieval_p99": percentile([r["retrieval_ms"] for r in ok], 99),
    }


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Prompt layouts on recurring documents (SQuAD v2 dev, through Query)",
        "",
        f"Host: {read_host_cpu().describe()}. Load before the run: {args.load_before}. "
        f"max_tokens {args.max_tokens}; answer cache off; each row a fresh server.",
        "",
        "| layout / workload | n | first visits TTFT p50 / p95 ms | revisits TTFT p50 / p95 ms | revisit/first p50 "
        "| prompt tokens p50 | cached p50 first / revisit | answer p50 ms | answer holds gold | highlight holds gold "
        "| unanswerable declined | evidence ms p50 | retrieval p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s = r["summary"]
        lines.append(
            f"| {name} | {s['n']} ({s['first_n']} first, {s['revisit_n']} revisits; {s['errors']} errors) "
            f"| {s['first_p50']:.0f} / {s['first_p95']:.0f} | {s['revisit_p50']:.0f} / {s['revisit_p95']:.0f} "
            f"| {s['ratio_p50']:.2f} | {s['prompt_p50']:.0f} "
            f"| {s['cached_first_p50']:.0f} / {s['cached_revisit_p50']:.0f} "
            f"| {s['total_p50']:.0f} | {s['answer_gold']:.3f} | {s['highlight_gold']:.3f} "
            f"| {s['declined_unanswerable']:.3f} | {s['evidence_p50']:.2f} | {s['retrieval_p99']:.1f} |"
        )
    lines += [
        "",
        "Support.low (RAGSERVE_LOW_SUPPORT_BELOW) against answerability, same requests:",
        "",
        "| layout / workload | unanswerable flagged | answerable flagged |",
        "|---|---|---|",
    ]
    for name, r in results.items():
        s = r["summary"]
        lines.append(f"| {name} | {s['low_support_unanswerable']:.3f} | {s['low_support_answerable']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(name.split(" / ")[1] for name in results))
    layouts = list(dict.fromkeys(name.split(" / ")[0] for name in results))
    fig, axes = plt.subplots(
        len(workloads), len(layouts), figsize=(4 * len(layouts), 3.2 * len(workloads)), sharex=True, squeeze=False
    )
    for name, r in results.items():
        layout, workload = name.split(" / ")
        ax = axes[workloads.index(workload)][layouts.index(layout)]
        ok = [row for row in r["rows"] if row["ok"] and "ttft_ms" in row]
        for revisit, label in ((False, "first visit"), (True, "revisit")):
            values = sorted(row["ttft_ms"] for row in ok if row["revisit"] == revisit)
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("client TTFT (ms)")
        ax.set_ylabel("share of requests")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "reuse")
    parser.add_argument("--index", type=Path, help="an index root of the corpus; default: built into OUT/index")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="LAYOUT or LAYOUT+CONTEXT_BUDGET, comma-separated")
    parser.add_argument("--workloads", default="recurring,zipf")
    parser.add_argument("--paragraphs", type=int, default=20)
    parser.add_argument("--zipf-questions", type=int, default=150)
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--replot", action="store_true", help="only redraw ttft.png from OUT/results.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        plot(json.loads((args.out / "results.json").read_text()), args.out)
        return
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    qs = load_questions(args.data, args.seed)
    workloads = {
        "recurring": recurring(qs, args.paragraphs, args.seed),
        "zipf": zipf(qs, args.zipf_questions, args.zipf_s, args.seed),
    }
    args.load_before = load_avg()
    results: dict[str, dict[str, Any]] = {}
    for workload in args.workloads.split(","):
        for layout in args.layouts.split(","):
            name = f"{layout} / {workload}"
            # "reusable+256": the layout with RAGSERVE_CONTEXT_TOKEN_BUDGET=256.
            layout_name, _, budget = layout.partition("+")
            env = {"RAGSERVE_PROMPT_LAYOUT": layout_name, "RAGSERVE_CACHE_ANSWERS": "false"}
            if budget:
                env["RAGSERVE_CONTEXT_TOKEN_BUDGET"] = budget
            process, target = start_server(
                args.index, env, args.out / f"server-{layout}-{workload}.log".replace("+", "-")
            )
            try:
                rows = asyncio.run(drive(target, workloads[workload], args.max_tokens))
            finally:
                stop_server(process)
            results[name] = {"rows": rows, "summary": summarize(rows)}
            s = results[name]["summary"]
            print(
                f"[{name}] first p50 {s['first_p50']:.0f} ms, revisit p50 {s['revisit_p50']:.0f} ms "
                f"({s['ratio_p50']:.2f}x); answer gold {s['answer_gold']:.3f}; load {load_avg()}",
                flush=True,
            )
    write_results(args.out, report(results, args), results)
    plot(results, args.out)


if __name__ == "__main__":
    main()
