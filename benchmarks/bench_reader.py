"""The reader through Query on SQuAD 2.0 dev, side by side with the lexical highlight alone, in one run.

    python benchmarks/bench_reader.py --out bench-results/reader

Indexes `<data>/corpus.jsonl` (or takes `--index`) and starts two fresh servers on it, one after the
other, answer cache off, warming settled, one question at a time, temperature 0:

  lexical   RAGSERVE_READER_ENABLED=false: the highlight and support of the lexical evidence alone
  reader    the default: the shipped reader (after the first token on this host)
  lead      RAGSERVE_READER_LEAD=true: the reader first, the sentence holding its span quoted
            before the question in the prompt (does the generated answer hold a gold span more often?)

Both ask the same --questions questions (answerable and unanswerable, seeded). Reported per row:
TTFT p50/p95, retrieval_total_ms p95, whether the generated answer holds a gold span; for the
reader: how often the evidence sentence a client shows holds a gold span (the sentence holding the
reader's span when it answers, else the lexical highlight; against the lexical row's), the span's
exact match and token F1 against gold (all answerable questions, and those whose gold paragraph was
retrieved first), its verdict on answerable and unanswerable questions (what abstention at the
reader's threshold would decline), how often its span came with the retrieval event rather than
after it, and its own ms p50/p95.

Writes results.md and results.json to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
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
from benchmarks.workloads import WARMUP, Question, contains_gold, load_questions, squad_normalize, wait_warm  # noqa: E402
from indexer.tune.reader_eval import token_f1  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402


async def ask(client: RagClient, q: Question, max_tokens: int) -> dict[str, Any]:
    """One Query: what was shown before the first token, the reader's span and when it came, the answer."""
    row: dict[str, Any] = {"id": q.id, "impossible": q.impossible, "ok": False, "span": None, "span_late": False}
    parts: list[str] = []
    passages: list[Any] = []
    started = time.perf_counter()
    async for event in client.query(q.question, max_tokens=max_tokens, temperature=0.0, timeout_s=120):
        kind = event.WhichOneof("event")
        if kind == "retrieval":
            r = event.retrieval
            passages = list(r.passages)
            row["top_doc"] = passages[0].doc_id if passages else ""
            shown = passages[r.support.evidence_passage] if passages else None
            row["highlight"] = (
                shown.text[shown.highlight.start : shown.highlight.end] if shown and shown.HasField("highlight") else ""
            )
            row["retrieval_ms"] = r.timings.retrieval_total_ms
            if r.HasField("answer"):
                row["span"] = _span(r.answer, passages)
                row["reader_ms"] = r.timings.reader_ms
        elif kind == "answer":
            row["span_late"] = True
            row["reader_ms"] = event.answer.reader_ms
            row["span"] = _span(event.answer.answer, passages) if event.answer.HasField("answer") else None
        elif kind == "token":
            row.setdefault("ttft_ms", (time.perf_counter() - started) * 1000.0)
            parts.append(event.token.text)
        elif kind == "final":
            row["finish"] = event.final.finish_reason
            row["ok"] = True
    row["answer"] = "".join(parts)
    span = row["span"]
    # What a client shows once the reader has spoken: the sentence holding a span that answers.
    row["shown"] = span["sentence"] if span and span["answers"] else row.get("highlight", "")
    if not q.impossible:
        row["answer_gold"] = contains_gold(row["answer"], q.answers)
        row["highlight_gold"] = contains_gold(row.get("highlight", ""), q.answers)
        row["shown_gold"] = contains_gold(row["shown"], q.answers)
        row["gold_first"] = row.get("top_doc") == q.doc_id
        if span:
            row["em"] = any(squad_normalize(span["text"]) == squad_normalize(a) for a in q.answers)
            row["f1"] = max((token_f1(span["text"], a) for a in q.answers), default=0.0)
    return row


def _span(answer: Any, passages: list[Any]) -> dict[str, Any]:
    text = passages[answer.passage].text if answer.passage < len(passages) else ""
    return {
        "text": answer.text,
        "answers": answer.answers,
        "margin": answer.margin,
        "sentence": text[answer.sentence_start : answer.sentence_end],
    }


async def drive(target: str, questions: list[Question], max_tokens: int) -> list[dict[str, Any]]:
    async with RagClient(target, default_timeout_s=120) as client:
        await wait_warm(client)
        return [await ask(client, q, max_tokens) for q in [WARMUP, *questions]][1:]


def share(rows: list[dict[str, Any]], key: str) -> float:
    return sum(1 for r in rows if r.get(key)) / max(1, len(rows))


def run(args: argparse.Namespace, name: str, env: dict[str, str], questions: list[Question]) -> dict[str, Any]:
    env = {"RAGSERVE_CACHE_ANSWERS": "false", "RAGSERVE_HOT_PASSAGES_PATH": str(args.out / f"hot-{name}.json"), **env}
    (args.out / f"hot-{name}.json").unlink(missing_ok=True)
    process, target = start_server(args.index, env, args.out / f"sidecar-{name}.log")
    try:
        rows = asyncio.run(drive(target, questions, args.max_tokens))
    finally:
        stop_server(process)
    ok = [r for r in rows if r["ok"] and "ttft_ms" in r]
    answerable = [r for r in ok if not r["impossible"]]
    unanswerable = [r for r in ok if r["impossible"]]
    spoken = [r for r in ok if r["span"] is not None]
    result: dict[str, Any] = {
        "rows": rows,
        "errors": len(rows) - len(ok),
        "ttft_p50": percentile([r["ttft_ms"] for r in ok], 50),
        "ttft_p95": percentile([r["ttft_ms"] for r in ok], 95),
        "retrieval_p95": percentile([r["retrieval_ms"] for r in ok], 95),
        "answer_gold": share(answerable, "answer_gold"),
        "highlight_gold": share(answerable, "highlight_gold"),
        "shown_gold": share(answerable, "shown_gold"),
    }
    if spoken:
        first = [r for r in answerable if r["gold_first"]]
        result.update(
            reader_p50=percentile([r["reader_ms"] for r in spoken], 50),
            reader_p95=percentile([r["reader_ms"] for r in spoken], 95),
            span_with_retrieval=1.0 - share(spoken, "span_late"),
            spans=len(spoken) / max(1, len(ok)),
            em=share(answerable, "em"),
            f1=sum(r.get("f1", 0.0) for r in answerable) / max(1, len(answerable)),
            em_gold_first=share(first, "em"),
            f1_gold_first=sum(r.get("f1", 0.0) for r in first) / max(1, len(first)),
            gold_first=len(first),
            declines_answerable=sum(1 for r in answerable if r["span"] and not r["span"]["answers"])
            / max(1, len(answerable)),
            declines_unanswerable=sum(1 for r in unanswerable if r["span"] and not r["span"]["answers"])
            / max(1, len(unanswerable)),
        )
    print(
        f"[{name}] TTFT p50 {result['ttft_p50']:.0f} / p95 {result['ttft_p95']:.0f} ms, retrieval p95 "
        f"{result['retrieval_p95']:.0f} ms, shown holds gold {result['shown_gold']:.2f}, errors {result['errors']}; "
        f"load {load_avg()}",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "reader")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = load_questions(args.data, args.seed)[: args.questions]
    load_before = load_avg()
    lexical = run(args, "lexical", {"RAGSERVE_READER_ENABLED": "false"}, questions)
    reader = run(args, "reader", {}, questions)
    lead = run(args, "lead", {"RAGSERVE_READER_LEAD": "true"}, questions)
    answerable = sum(1 for q in questions if not q.impossible)
    lines = [
        "# The reader through Query (SQuAD 2.0 dev sample)",
        "",
        f"Host: {read_host_cpu().describe()}. Commit {git_head()}. Load before: {load_before}. "
        f"{len(questions)} questions ({answerable} answerable), max_tokens {args.max_tokens}, one at a time, "
        "answer cache off, warming settled, a fresh server per row.",
        "",
        "| row | TTFT p50 / p95 ms | retrieval p95 ms | shown sentence holds gold | answer holds gold |",
        "|---|---|---|---|---|",
    ]
    for name, r in (("lexical", lexical), ("reader", reader), ("lead", lead)):
        lines.append(
            f"| {name} | {r['ttft_p50']:.0f} / {r['ttft_p95']:.0f} | {r['retrieval_p95']:.0f} "
            f"| {r['shown_gold']:.2f} | {r['answer_gold']:.2f} |"
        )
    if "em" in reader:
        lines += [
            "",
            f"- TTFT with the reader / without: p50 {reader['ttft_p50'] / lexical['ttft_p50']:.2f}x, "
            f"p95 {reader['ttft_p95'] / lexical['ttft_p95']:.2f}x",
            f"- reader ms p50 {reader['reader_p50']:.0f} / p95 {reader['reader_p95']:.0f}; its span came with the "
            f"retrieval event for {reader['span_with_retrieval']:.2f} of questions (the rest between the tokens)",
            f"- span on answerable questions: EM {reader['em']:.2f}, F1 {reader['f1']:.2f}; where the gold paragraph "
            f"was retrieved first ({reader['gold_first']}): EM {reader['em_gold_first']:.2f}, "
            f"F1 {reader['f1_gold_first']:.2f}",
            f"- the reader's verdict (abstention at its threshold): declines {reader['declines_answerable']:.2f} of "
            f"answerable and {reader['declines_unanswerable']:.2f} of unanswerable questions",
            f"- with the reader's sentence before the question: the answer holds gold {lead['answer_gold']:.2f} "
            f"against {reader['answer_gold']:.2f}; TTFT p50 {lead['ttft_p50'] / reader['ttft_p50']:.2f}x, "
            f"p95 {lead['ttft_p95'] / reader['ttft_p95']:.2f}x of the reader row's",
        ]
    write_results(args.out, "\n".join(lines) + "\n", {"lexical": lexical, "reader": reader, "lead": lead})


if __name__ == "__main__":
    main()
