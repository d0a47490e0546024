"""Highlights and abstention on SQuAD v2 dev, through the real retrieval path (no generator).

    python benchmarks/bench_evidence.py --data ../shared/data/squad2-dev --out bench-results/evidence

Indexes `<data>/corpus.jsonl` (or takes `--index`), builds the server's own pipeline in process
(real MiniLM embedder, hnswlib + BM25, the configured reranker; generation off) and retrieves every
question of `<data>/questions.jsonl` at the default top_k. Reports:

- how often a highlight holds a gold answer span (SQuAD normalization): the top passage's, the one
  the server names as the evidence (Support.evidence_passage), and the one with the best coverage
  among the passages; with and without the gold paragraph ranked first;
- the evidence stage's server time (StageTimings.evidence_ms) p50/p95/p99 at each `--top-k`;
- for abstention: per threshold on Support.coverage, the share of unanswerable questions flagged
  (recall), the share of answerable ones flagged, the precision of the flag, and the share of
  off-corpus questions flagged; and how well other signals separate unanswerable questions (AUC).

Writes results.md and results.json to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import ensure_index, percentile, write_results  # noqa: E402
from benchmarks.workloads import contains_gold, load_questions  # noqa: E402
from ragserve.budget import Deadline, RequestContext  # noqa: E402
from ragserve.config import AnswerSettings, IndexSettings, Settings, default_of  # noqa: E402
from ragserve.factory import make_pipeline  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402
from ragserve.request.sentences import content_terms, question_weights, sentence_spans  # noqa: E402
from ragserve.types import Passage, RetrievalResult, RetrieveParams  # noqa: E402

THRESHOLDS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)


def highlight_text(passage: Passage) -> str:
    h = passage.highlight
    return "" if h is None else passage.chunk.text[h.start : h.end]


def best_highlight(result: RetrievalResult) -> Passage:
    return max(result.passages, key=lambda p: (p.highlight.coverage if p.highlight else -1.0, -p.rank))


def dense_assisted_sentence(question: str, result: RetrievalResult, embedder: Any, query_vector: Any) -> str:
    """Not served: the sentence among all passages with the best lexical coverage plus dense cosine
    to the question. It needs an embedding per sentence; measured to show what that would buy."""
    sentences = [p.chunk.text[a:b] for p in result.passages for a, b in sentence_spans(p.chunk.text)]
    if not sentences:
        return ""
    terms = [content_terms(s) for s in sentences]
    weights = question_weights(question, terms)
    cosines = embedder.embed_queries(sentences) @ query_vector
    scores = [weights.coverage(t) + float(c) for t, c in zip(terms, cosines, strict=True)]
    return sentences[int(np.argmax(scores))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(index=IndexSettings(path=args.index), answer=AnswerSettings(generation_enabled=False))
    pipeline = make_pipeline(settings, with_generator=False)
    rows: list[dict[str, Any]] = []
    timing: dict[int, list[float]] = {}
    async with pipeline:
        questions = load_questions(args.data, seed=0)
        for q in questions:
            result = await pipeline.retrieve(
                RetrieveParams(q.question, args.top_k, 1000), RequestContext(Deadline(1000))
            )
            top, best = result.passages[0], best_highlight(result)
            shown = result.passages[result.support.evidence_passage] if result.support else top
            # Other signals the server could use to decline (compared by AUC in the report).
            query_vector = pipeline.embedder.embed_query(q.question).vector
            sentences = [top.chunk.text[a:b] for a, b in sentence_spans(top.chunk.text)] or [top.chunk.text]
            sentence_vectors = pipeline.embedder.embed_queries(sentences)
            passage_vector = pipeline.embedder.embed_queries([top.chunk.text])[0]
            rows.append(
                {
                    "top_score": top.score,
                    "margin": top.score - result.passages[1].score if len(result.passages) > 1 else 0.0,
                    "sentence_cosine": float(np.max(sentence_vectors @ query_vector)),
                    "passage_cosine": float(passage_vector @ query_vector),
                    "id": q.id,
                    "impossible": q.impossible,
                    "gold_first": top.chunk.doc_id == q.doc_id,
                    "top_highlight_gold": (not q.impossible) and contains_gold(highlight_text(top), q.answers),
                    "best_highlight_gold": (not q.impossible) and contains_gold(highlight_text(best), q.answers),
                    "evidence_highlight_gold": (not q.impossible) and contains_gold(highlight_text(shown), q.answers),
                    "dense_assisted_gold": (not q.impossible)
                    and contains_gold(
                        dense_assisted_sentence(q.question, result, pipeline.embedder, query_vector), q.answers
                    ),
                    "coverage": result.support.coverage if result.support else 0.0,
                    "top_coverage": top.highlight.coverage if top.highlight else 0.0,
                    "evidence_ms": result.timings.evidence_ms,
                }
            )
        off_corpus = []
        if args.off_corpus is not None:
            with args.off_corpus.open() as f:
                texts = [json.loads(line)["text"] for line in f if line.strip()][: args.off_corpus_questions]
            for text in texts:
                result = await pipeline.retrieve(RetrieveParams(text, args.top_k, 1000), RequestContext(Deadline(1000)))
                off_corpus.append(result.support.coverage if result.support else 0.0)
        for top_k in args.timing_top_k:
            times = timing.setdefault(top_k, [])
            for q in questions[: args.timing_questions]:
                # A fresh wording each time: a retrieval cache hit would skip nothing the evidence does.
                params = RetrieveParams(f"{q.question} ({time.perf_counter_ns()})", top_k, 1000)
                times.append((await pipeline.retrieve(params, RequestContext(Deadline(1000)))).timings.evidence_ms)
    return {"rows": rows, "timing": timing, "off_corpus": off_corpus}


def report(data: dict[str, Any], args: argparse.Namespace) -> str:
    rows = data["rows"]
    answerable = [r for r in rows if not r["impossible"]]
    impossible = [r for r in rows if r["impossible"]]

    def share(items: list[dict[str, Any]], key: str) -> float:
        return sum(bool(r[key]) for r in items) / max(1, len(items))

    lines = [
        "# Highlights and abstention (SQuAD v2 dev, retrieval in process)",
        "",
        f"Host: {read_host_cpu().describe()}. {len(answerable)} answerable and {len(impossible)} unanswerable "
        f"questions, top_k {args.top_k}, reranker mode {default_of(Settings, 'rerank').mode}.",
        "",
        "| highlight holds a gold span (answerable questions) | share |",
        "|---|---|",
        f"| top passage's highlight | {share(answerable, 'top_highlight_gold'):.3f} |",
        f"| the evidence passage's highlight | {share(answerable, 'evidence_highlight_gold'):.3f} |",
        f"| best-coverage highlight among the passages | {share(answerable, 'best_highlight_gold'):.3f} |",
        "| not served: the best sentence among the passages by coverage + dense cosine "
        f"| {share(answerable, 'dense_assisted_gold'):.3f} |",
        f"| gold paragraph ranked first | {share(answerable, 'gold_first'):.3f} |",
    ]
    first = [r for r in answerable if r["gold_first"]]
    lines.append(
        f"| top passage's highlight, when the gold paragraph is first | {share(first, 'top_highlight_gold'):.3f} |"
    )
    lines += ["", "| top_k | evidence ms p50 | p95 | p99 |", "|---|---|---|---|"]
    for top_k, times in data["timing"].items():
        lines.append(
            f"| {top_k} | {percentile(times, 50):.2f} | {percentile(times, 95):.2f} | {percentile(times, 99):.2f} |"
        )
    lines += [
        "",
        "Abstention: unanswerable = SQuAD v2's unanswerable questions (written against the same paragraphs); "
        "off-corpus = other questions (`--off-corpus`) asked of this index, about things it does not hold.",
        "",
        "| flag low support below (Support.coverage) | unanswerable flagged (recall) | answerable flagged "
        "| precision | off-corpus flagged |",
        "|---|---|---|---|---|",
    ]
    off = data["off_corpus"]
    for threshold in THRESHOLDS:
        flagged_impossible = sum(r["coverage"] < threshold for r in impossible)
        flagged_answerable = sum(r["coverage"] < threshold for r in answerable)
        flagged = flagged_impossible + flagged_answerable
        lines.append(
            f"| {threshold:.2f} | {flagged_impossible / max(1, len(impossible)):.3f} | "
            f"{flagged_answerable / max(1, len(answerable)):.3f} | {flagged_impossible / max(1, flagged):.3f} | "
            + (f"{sum(c < threshold for c in off) / len(off):.3f} |" if off else "- |")
        )
    lines += [
        "",
        "Signals for declining SQuAD's unanswerable questions: AUC, answerable questions scoring higher "
        "(0.5 = no better than chance).",
        "",
        "| signal | AUC |",
        "|---|---|",
    ]
    for signal in ("coverage", "top_score", "margin", "sentence_cosine", "passage_cosine"):
        lines.append(f"| {signal} | {auc([r[signal] for r in answerable], [r[signal] for r in impossible]):.3f} |")
    return "\n".join(lines) + "\n"


def auc(positive: list[float], negative: list[float]) -> float:
    """P(a positive scores above a negative), ties counted half."""
    neg = np.asarray(negative)
    if not positive or not neg.size:
        return float("nan")
    return float(np.mean([np.mean(neg < p) + 0.5 * np.mean(neg == p) for p in positive]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "evidence")
    parser.add_argument("--index", type=Path, help="an index root of the corpus; default: built into OUT/index")
    parser.add_argument("--top-k", type=int, default=default_of(Settings, "requests").default_top_k)
    parser.add_argument(
        "--off-corpus",
        type=Path,
        default=REPO.parent / "shared" / "data" / "scifact" / "queries.jsonl",
        help="questions (JSON lines with a `text` field) the corpus does not answer",
    )
    parser.add_argument("--off-corpus-questions", type=int, default=300)
    parser.add_argument("--timing-top-k", type=int, nargs="+", default=[3, 10, 50])
    parser.add_argument("--timing-questions", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    data = asyncio.run(run(args))
    write_results(args.out, report(data, args), data)


if __name__ == "__main__":
    main()
