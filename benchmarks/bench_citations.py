"""Citations through Query on SQuAD 2.0 dev: located, before the final event, and checked; and the
first token against another tree's server on the same questions.

    python benchmarks/bench_citations.py --out bench-results/citations
    python benchmarks/bench_citations.py --out bench-results/citations --baseline-repo /tmp/base-tree

Indexes `<data>/corpus.jsonl` (or takes `--index`) and starts a fresh server on it, answer cache
off, temperature 0, and asks --questions answerable held-out questions one at a time right after
SERVING (warming running beside them, as a user meets it). Per answer: its citation events, each
checked to come before the final event and after the token that closes its marker, its quote
checked against the corpus text at its stated range; whether the answer holds a gold span; and
whether the final event flags it unsupported. Reported: how often `unsupported` marks an answer
without a gold span and how often one with it.

With --baseline-repo the same questions go to a server started from that tree, and this tree's
again, in the order baseline, this, this, baseline (so drift over the run falls on both); the
index is then built by the baseline tree, so both read it (an older tree refuses a newer format).
TTFT p50/p95 of each and their ratio are reported. Writes results.md and results.json to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import git_head, load_avg, percentile, start_server, stop_server, write_results  # noqa: E402
from benchmarks.workloads import WARMUP, Question, contains_gold, load_questions  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402


async def ask(client: RagClient, q: Question, max_tokens: int, corpus: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": q.id, "ok": False, "citations": [], "before_final": True, "after_marker": True}
    text = ""
    started = time.perf_counter()
    async for event in client.query(q.question, max_tokens=max_tokens, temperature=0.0, timeout_s=120):
        kind = event.WhichOneof("event")
        if kind == "token":
            row.setdefault("ttft_ms", (time.perf_counter() - started) * 1000.0)
            text += event.token.text
        elif kind == "citation":
            c = event.citation
            source = corpus.get(c.doc_id, "")
            row["citations"].append(
                {
                    "marker": c.marker,
                    "supported": c.supported,
                    "located": c.HasField("location"),
                    "quote_at_range": bool(c.quote) and source[c.quote_start : c.quote_end] == c.quote,
                }
            )
            row["after_marker"] &= f"[{c.marker}]" in text[-12:]
        elif kind == "final":
            f = event.final
            row.update(ok=True, unsupported=f.unsupported, declined=f.declined, repeated=len(f.citations))
    row["answer"] = text
    row["gold"] = contains_gold(text, q.answers)
    return row


async def drive(target: str, questions: list[Question], max_tokens: int, corpus: dict[str, str]) -> list[dict]:
    async with RagClient(target, default_timeout_s=120) as client:
        return [await ask(client, q, max_tokens, corpus) for q in [WARMUP, *questions]][1:]


def serve_and_ask(args: argparse.Namespace, name: str, repo: Path, questions: list[Question], corpus: dict) -> list:
    env = {"RAGSERVE_CACHE_ANSWERS": "false", "RAGSERVE_HOT_PASSAGES_PATH": str(args.out / f"hot-{name}.json")}
    (args.out / f"hot-{name}.json").unlink(missing_ok=True)
    process, target = start_server(args.index, env, args.out / f"sidecar-{name}.log", repo=repo)
    try:
        rows = asyncio.run(drive(target, questions, args.max_tokens, corpus))
    finally:
        stop_server(process)
    ok = [r for r in rows if r["ok"] and "ttft_ms" in r]
    ttft = [r["ttft_ms"] for r in ok]
    print(f"[{name}] TTFT p50 {percentile(ttft, 50):.0f} / p95 {percentile(ttft, 95):.0f} ms; load {load_avg()}")
    return rows


def share(rows: list[dict], test: Any) -> str:
    hits = sum(1 for r in rows if test(r))
    return f"{hits / max(1, len(rows)):.3f} ({hits}/{len(rows)})"


def _repeated(row: dict) -> bool:
    return bool(row["repeated"] == len(row["citations"]))


def citation_table(rows: list[dict]) -> str:
    answered = [r for r in rows if r["ok"] and not r.get("declined")]
    cited = [c for r in answered for c in r["citations"]]
    with_gold = [r for r in answered if r["gold"]]
    without = [r for r in answered if not r["gold"]]
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| answers (not declined) | {len(answered)} |",
        f"| answers with at least one citation event | {share(answered, lambda r: r['citations'])} |",
        f"| citations repeated in the final event | {share(answered, _repeated)} |",
        f"| each citation after its marker's token | {share(answered, lambda r: r['after_marker'])} |",
        f"| citations located (format 3) | {share(cited, lambda c: c['located'])} |",
        f"| quotes equal to the corpus text at their range | {share(cited, lambda c: c['quote_at_range'])} |",
        f"| citations supported | {share(cited, lambda c: c['supported'])} |",
        f"| `unsupported` on answers WITHOUT a gold span | {share(without, lambda r: r['unsupported'])} |",
        f"| `unsupported` on answers WITH a gold span | {share(with_gold, lambda r: r['unsupported'])} |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "citations")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--baseline-repo", type=Path, help="another tree whose server is compared on TTFT")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus_file = args.data / "corpus.jsonl"
    corpus = {d["_id"]: d["text"] or d.get("title", "") for d in map(json.loads, corpus_file.open())}
    if args.index is None:
        args.index = args.out / "index"
        if not (args.index / "CURRENT").exists():
            builder = args.baseline_repo or REPO
            build = [sys.executable, "-m", "indexer", "build", str(corpus_file), "--out", str(args.index)]
            build.append("--no-progress")
            subprocess.run(build, cwd=builder, check=True)
    questions = [q for q in load_questions(args.data, args.seed) if not q.impossible][: args.questions]
    runs: dict[str, list[dict]] = {}
    order = ["baseline", "this", "this-again", "baseline-again"] if args.baseline_repo else ["this"]
    for name in order:
        repo = args.baseline_repo if name.startswith("baseline") else REPO
        runs[name] = serve_and_ask(args, name, repo, questions, corpus)
    host = read_host_cpu().describe()
    text = f"Citations through Query, SQuAD 2.0 dev, {len(questions)} answerable questions; host: {host}; "
    text += f"commit {git_head()}\n\n" + citation_table(runs["this"] + runs.get("this-again", [])) + "\n"
    if args.baseline_repo:
        pooled = {
            side: [r["ttft_ms"] for name, rows in runs.items() if name.startswith(side) for r in rows if "ttft_ms" in r]
            for side in ("this", "baseline")
        }
        baseline = git_head(args.baseline_repo)
        text += f"\nFirst token, right after SERVING, against {baseline} (pooled over two starts each):\n\n"
        text += "| server | TTFT p50 ms | TTFT p95 ms |\n|---|---|---|\n"
        for side, values in pooled.items():
            text += f"| {side} | {percentile(values, 50):.0f} | {percentile(values, 95):.0f} |\n"
        p50 = percentile(pooled["this"], 50) / percentile(pooled["baseline"], 50)
        p95 = percentile(pooled["this"], 95) / percentile(pooled["baseline"], 95)
        text += f"\nratio this/baseline: p50 {p50:.3f}, p95 {p95:.3f}\n"
    write_results(args.out, text, runs)


if __name__ == "__main__":
    main()
