"""The decline before the generator, on questions the served documents do not cover.

    python benchmarks/bench_decline.py --out bench-results/decline
    python benchmarks/bench_decline.py --out /tmp/decline --no-scifact
    python benchmarks/bench_decline.py --out /tmp/decline --rows /tmp/decline/results.json  # score again

SQuAD 2.0 dev (`../shared/data/squad2-dev`, never fitted on): its corpus of 5 articles is served
with Normans, then Computational complexity theory, left out (one index, rebuilt incrementally);
"absent" are the left-out article's answerable questions, "covered" the other article's answerable
ones; reported apart, the left-out article's unanswerable questions and the served article's
(adversarial: written against a paragraph the corpus holds). Each question is retrieved through
the pipeline in this process as Query retrieves it (default top_k, no cache) and the shipped model
(ragserve/request/decline_model.json, not refitted) decides at the default false rate
(RAGSERVE_DECLINE_FALSE_RATE) and at a few others.

SciFact (`../shared/data/scifact`, BEIR): claims split at random into two sets of 200; the corpus
served holds the abstracts the second set cites ("covered"; a claim sharing a cited abstract with
the first set is dropped) and others drawn at random up to `--scifact-docs`, never one the first
set cites ("absent").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, git_head, load_avg, write_results  # noqa: E402
from indexer.tune.decline import auc  # noqa: E402
from indexer.tune.decline_data import Asked, ask_all, index_corpus, leave_one_out_in, read_rows, write_corpus  # noqa: E402
from ragserve.config import AnswerSettings, default_of  # noqa: E402
from ragserve.request.decline import SIGNALS, DeclineModel  # noqa: E402

DATA = REPO.parent / "shared" / "data"
RATES = (0.02, 0.035, 0.05)
KINDS = ("absent", "covered", "impossible", "adversarial")


def scifact_rows(folder: Path, work: Path, per_side: int, docs: int, seed: int = 0) -> list[Asked]:
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines() if line.strip()]
    claims = {str(q["_id"]): str(q["text"]) for q in map(json.loads, (folder / "queries.jsonl").open())}
    cited: dict[str, set[str]] = {}
    for line in (folder / "qrels.tsv").read_text().splitlines()[1:]:
        qid, doc, _ = line.split("\t")
        cited.setdefault(qid, set()).add(doc)
    ids = sorted(q for q in cited if q in claims)
    random.Random(seed).shuffle(ids)
    absent = ids[:per_side]
    removed = set().union(*(cited[q] for q in absent))
    covered = [q for q in ids[per_side:] if not cited[q] & removed][:per_side]
    work.mkdir(parents=True, exist_ok=True)
    # The covered claims' abstracts and others drawn at random, up to `docs` (a smaller build).
    kept = set().union(*(cited[q] for q in covered))
    others = [str(r["_id"]) for r in corpus if str(r["_id"]) not in removed | kept]
    kept |= set(random.Random(seed).sample(others, max(0, min(len(others), docs - len(kept)))))
    served = write_corpus((r for r in corpus if str(r["_id"]) in kept), work / "corpus.jsonl")
    index_corpus(served, work / "index")
    asked = [(q, claims[q], "absent") for q in absent] + [(q, claims[q], "covered") for q in covered]
    return asyncio.run(ask_all(work / "index", asked, "scifact"))


def declined_share(model: DeclineModel, rows: Sequence[Asked], threshold: float) -> float | None:
    """As the server decides: a question whose signals cannot all be measured is answered."""
    if not rows:
        return None
    scored = [r for r in rows if all(r.signals.get(n) is not None for n in model.names)]
    declined = sum(model.score({n: float(r.signals[n] or 0.0) for n in model.names}) >= threshold for r in scored)
    return declined / len(rows)


def table(model: DeclineModel, rows: Sequence[Asked], groups: Sequence[str]) -> list[str]:
    lines = [
        "| served without | false rate (threshold) | " + " | ".join(f"{k} declined" for k in KINDS) + " |",
        "|---|---|" + "---|" * len(KINDS),
    ]
    for group in groups:
        mine = [r for r in rows if r.group == group]
        for rate in RATES:
            threshold = model.threshold_for(rate)
            cells = []
            for kind in KINDS:
                of_kind = [r for r in mine if r.kind == kind]
                share = declined_share(model, of_kind, threshold)
                cells.append("-" if share is None else f"{share:.3f} (n={len(of_kind)})")
            lines.append(f"| {group} | {rate} ({threshold:.3f}) | " + " | ".join(cells) + " |")
    return lines


def signal_aucs(rows: Sequence[Asked]) -> dict[str, float]:
    """Each signal alone: the chance an absent question's value lies above a covered one's (AUC
    below 0.5: lower values mean absent)."""
    out = {}
    for name in SIGNALS:
        kept = [r for r in rows if r.kind in ("absent", "covered") and r.signals.get(name) is not None]
        values = np.array([float(r.signals[name] or 0.0) for r in kept])
        out[name] = auc(values, np.array([r.kind == "absent" for r in kept]))
    return out


def model_aucs(model: DeclineModel, rows: Sequence[Asked], groups: Sequence[str]) -> list[str]:
    out = []
    for group in groups:
        kept = [r for r in rows if r.group == group and r.kind in ("absent", "covered")]
        scores = np.array([model.score({n: float(r.signals[n] or 0.0) for n in model.names}) for r in kept])
        out.append(f"{group} {auc(scores, np.array([r.kind == 'absent' for r in kept])):.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--no-scifact", action="store_true")
    parser.add_argument("--scifact-claims", type=int, default=200)
    parser.add_argument("--scifact-docs", type=int, default=2000, help="abstracts served (all: 5183)")
    parser.add_argument("--rows", type=Path, default=None, help="a results.json of this script: score its rows again")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = DeclineModel.load()
    default_rate = default_of(AnswerSettings, "decline_false_rate")
    if args.rows is not None:
        rows = read_rows(args.rows)
    else:
        rows = leave_one_out_in(args.data / "squad2-dev", 10**6, args.out / "squad2-dev", adversarial=True)
        if not args.no_scifact:
            rows += scifact_rows(args.data / "scifact", args.out / "scifact", args.scifact_claims, args.scifact_docs)
    groups = sorted({r.group for r in rows} - {"scifact"}) + (
        ["scifact"] if any(r.group == "scifact" for r in rows) else []
    )
    spent = np.array([r.decide_us for r in rows])
    squad = [r for r in rows if r.group != "scifact"]
    lines = [
        f"# The decline before the generator ({cpu_name()}, load {load_avg()}, {git_head()})",
        f"shipped model: {', '.join(model.names)}; default RAGSERVE_DECLINE_FALSE_RATE {default_rate}",
        "",
        *table(model, rows, groups),
        "",
        f"signals' time per question: p50 {np.percentile(spent, 50):.0f} us, p99 {np.percentile(spent, 99):.0f} us",
        "AUC of each signal alone, SQuAD dev (absent above covered): "
        + ", ".join(f"{n} {v:.3f}" for n, v in signal_aucs(squad).items()),
    ]
    lines.append(
        "AUC of the shipped model's score (absent above covered): " + ", ".join(model_aucs(model, rows, groups))
    )
    if "scifact" in groups:
        lines.append(
            "AUC, SciFact: "
            + ", ".join(f"{n} {v:.3f}" for n, v in signal_aucs([r for r in rows if r.group == "scifact"]).items())
        )
    results: dict[str, Any] = {"rows": [asdict(r) for r in rows], "default_rate": default_rate}
    write_results(args.out, "\n".join(lines), results)


if __name__ == "__main__":
    main()
