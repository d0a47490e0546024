"""How well the signals the server has before the first token tell answerable questions from
unanswerable ones (SQuAD v2 dev), each alone and combined: the ground a calibrated decline stands on.

    python benchmarks/bench_declines.py --out bench-results/declines
    python benchmarks/bench_declines.py --out /tmp/declines --index /tmp/squad-index

Indexes `<data>/corpus.jsonl` (default ../shared/data/squad2-dev next to the repository), starts a
real `ragserve serve` with generation off (the reader with a budget that always lets it read), and
asks every question through Retrieve (top_k 5, answer_span), as Query's own retrieval does. Per
question, what the reply carries: the top passage's score and its lead over the second, the best
highlight's coverage (Support), and the reader's margin (its span against "no answer"). With
`--engine`, also the tuned model's log-probability of the template's decline sentence after the
prompt (the product's engine in this process, the question's own paragraph as its passage).

The questions are split by article into two halves: a logistic regression over the signals (and
each signal's threshold) is fitted on one half, and every figure is reported on the other. For a
target rate of answerable questions declined (`--false-decline`, 0.10), the threshold is chosen on
the fitting half; the table gives what it does on the reported half, and the curve (a plot) shows
every threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    ensure_index,
    git_head,
    load_avg,
    start_server,
    stop_server,
    write_results,
)
from benchmarks.workloads import load_questions  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-dev"
PRE_SIGNALS = ("top_score", "top_lead", "coverage", "reader_margin")
ENGINE_SIGNALS = ("decline_logprob",)
NO_SPAN_MARGIN = -20.0  # the reader found no span at all: as sure as it gets that none is there


async def engine_signal(data: Path, rows: list[dict[str, Any]], questions: list[Any]) -> None:
    """The tuned model's log-probability of the template's decline sentence right after the prompt
    (the product's engine and prompt, the question's own paragraph as its one passage: retrieval
    holds it for nearly every question), into each row as `decline_logprob`."""
    import json
    import uuid

    from vllm import SamplingParams

    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.prompt import DECLINE_SENTENCE, build_prompt
    from ragserve.types import Chunk, Passage

    with (data / "corpus.jsonl").open() as f:
        corpus = {row["_id"]: row for row in map(json.loads, f)}
    generator = VllmGenerator(GeneratorSettings())
    await generator.start()
    engine = generator._engine  # prompt log-probabilities, which stream() does not give

    async def last(text: str, sampling: Any) -> Any:
        final = None
        async for output in engine.generate(text, sampling, request_id=uuid.uuid4().hex):
            final = output
        return final

    for row, q in zip(rows, questions, strict=True):
        doc = corpus[q.doc_id]
        chunk = Chunk(chunk_id=f"{q.doc_id}#0", doc_id=q.doc_id, text=doc["text"], title=doc.get("title", ""))
        prompt = generator.render(build_prompt(q.question, [Passage(chunk, 1.0, 1)]))
        asked = await last(prompt, SamplingParams(max_tokens=1, temperature=0.0))
        forced = await last(prompt + DECLINE_SENTENCE, SamplingParams(max_tokens=1, prompt_logprobs=0))
        tail = forced.prompt_logprobs[len(asked.prompt_token_ids) :]
        row["decline_logprob"] = float(sum(next(iter(d.values())).logprob for d in tail if d))
    await generator.close()


async def collect(target: str, questions: list[Any]) -> list[dict[str, Any]]:
    rows = []
    async with RagClient(target) as client:
        for q in questions:
            reply = await client.retrieve(q.question, top_k=5, answer_span=True, timeout_s=30)
            scores = [p.score for p in reply.passages]
            has_span = reply.HasField("answer") and bool(reply.answer.text)
            rows.append(
                {
                    "id": q.id,
                    "doc_id": q.doc_id,
                    "impossible": q.impossible,
                    "top_score": scores[0] if scores else 0.0,
                    "top_lead": scores[0] - scores[1] if len(scores) > 1 else 0.0,
                    "coverage": reply.support.coverage,
                    "reader_margin": reply.answer.margin if has_span else NO_SPAN_MARGIN,
                }
            )
    return rows


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 50) -> np.ndarray:
    """Weights (bias last) of P(unanswerable) by Newton's method on standardised features."""
    design = np.hstack([x, np.ones((len(x), 1))])
    weights = np.zeros(design.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(design @ weights)))
        gradient = design.T @ (p - y) + l2 * np.r_[weights[:-1], 0.0]
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + l2 * np.eye(len(weights))
        weights -= np.linalg.solve(hessian, gradient)
    return weights


def decline_scores(rows: list[dict[str, Any]], names: tuple[str, ...], model: dict[str, Any]) -> np.ndarray:
    x = (np.array([[r[n] for n in names] for r in rows]) - model["mean"]) / model["std"]
    return np.asarray(np.hstack([x, np.ones((len(x), 1))]) @ model["weights"])


def fitted(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, Any]:
    x = np.array([[r[n] for n in names] for r in rows])
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-9
    y = np.array([float(r["impossible"]) for r in rows])
    return {"mean": mean, "std": std, "weights": fit_logistic((x - mean) / std, y)}


def rates(scores: np.ndarray, impossible: np.ndarray, threshold: float) -> tuple[float, float]:
    """(unanswerable declined, answerable declined) when scores at or above `threshold` decline."""
    declined = scores >= threshold
    return float(declined[impossible].mean()), float(declined[~impossible].mean())


def threshold_for(scores: np.ndarray, impossible: np.ndarray, false_decline: float) -> float:
    """The lowest threshold whose answerable-declined rate is at most `false_decline`."""
    answerable = np.sort(scores[~impossible])
    index = int(np.ceil((1.0 - false_decline) * len(answerable)))
    return float(answerable[index]) if index < len(answerable) else float(answerable[-1]) + 1e-6


def evaluate(
    fit_rows: list[dict[str, Any]], report_rows: list[dict[str, Any]], target: float, signals: tuple[str, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    impossible_fit = np.array([r["impossible"] for r in fit_rows])
    impossible_rep = np.array([r["impossible"] for r in report_rows])
    for label, names in [*((n, (n,)) for n in signals), ("combined", signals)]:
        model = fitted(fit_rows, names)
        threshold = threshold_for(decline_scores(fit_rows, names, model), impossible_fit, target)
        reported = decline_scores(report_rows, names, model)
        true_decline, false_decline = rates(reported, impossible_rep, threshold)
        curve = [rates(reported, impossible_rep, t) for t in np.quantile(reported, np.linspace(0, 1, 41))]
        out[label] = {
            "declines_unanswerable": true_decline,
            "declines_answerable": false_decline,
            "auc": auc(reported, impossible_rep),
            "curve": curve,
        }
    return out


def auc(scores: np.ndarray, impossible: np.ndarray) -> float:
    """The chance that an unanswerable question scores above an answerable one (ties count half)."""
    above = scores[impossible][:, None] - scores[~impossible][None, :]
    return float((above > 0).mean() + 0.5 * (above == 0).mean())


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for label, r in results.items():
        curve = sorted(r["curve"], key=lambda point: point[1])
        ax.plot([c[1] for c in curve], [c[0] for c in curve], label=label)
    ax.set_xlabel("answerable questions declined")
    ax.set_ylabel("unanswerable questions declined")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "declines.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--false-decline", type=float, default=0.10)
    parser.add_argument("--engine", action="store_true", help="also the tuned model's decline log-probability")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = load_questions(args.data, seed=0)
    env = {"RAGSERVE_GENERATION_ENABLED": "false", "RAGSERVE_READER_BUDGET_MS": "2000", "RAGSERVE_CACHE_BACKEND": "off"}
    process, target = start_server(index, env, args.out / "server.log")
    try:
        rows = asyncio.run(collect(target, questions))
    finally:
        stop_server(process)
    if args.engine:
        asyncio.run(engine_signal(args.data, rows, questions))
    signals = PRE_SIGNALS + (ENGINE_SIGNALS if args.engine else ())
    articles = sorted({r["doc_id"].split("#")[0] for r in rows})
    fit_half = set(articles[::2])
    fit_rows = [r for r in rows if r["doc_id"].split("#")[0] in fit_half]
    report_rows = [r for r in rows if r["doc_id"].split("#")[0] not in fit_half]
    results = evaluate(fit_rows, report_rows, args.false_decline, signals)
    plot(results, args.out)
    answerable = sum(not r["impossible"] for r in report_rows)
    lines = [
        f"# Declines from the signals before the first token ({cpu_name()}, load {load_avg()}, {git_head()})",
        f"fitted on {len(fit_rows)} questions of {len(fit_half)} articles, reported on {len(report_rows)} "
        f"({answerable} answerable) of the others; threshold for {args.false_decline:.2f} answerable declined",
        "",
        "| signal | AUC | unanswerable declined | answerable declined |",
        "|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['auc']:.3f} | {r['declines_unanswerable']:.3f} | {r['declines_answerable']:.3f} |"
        )
    write_results(args.out, "\n".join(lines), {"rows": rows, "results": results})


if __name__ == "__main__":
    main()
