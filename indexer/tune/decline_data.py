"""The decline's data: questions served against a corpus that holds their article or not.

A SQuAD-format folder is served with one article left out at a time (one index root, rebuilt
incrementally per article, so only the article put back is embedded again); that article's
answerable questions are "absent", the served articles' answerable ones "covered"; the left out
article's unanswerable ones are "impossible" and the served articles' "adversarial" (written
against a paragraph the corpus holds, by changing a word): neither is fitted on. Each question is
retrieved as Query retrieves it (the pipeline in this process, its default top_k, no cache) and
every signal of request/decline.py is measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from indexer.tune.reader_data import SquadQuestion, load_squad
from ragserve.budget import Deadline, RequestContext
from ragserve.config import AnswerSettings, CacheSettings, IndexSettings, RequestSettings, Settings
from ragserve.request.decline import SIGNALS
from ragserve.request.sentences import SentenceTable
from ragserve.types import RetrieveParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Asked:
    """One question served against one corpus, and what the decline would read."""

    qid: str
    group: str  # the corpus it was asked against (the article left out)
    kind: str  # "absent", "covered" or "impossible"
    signals: dict[str, float | None] = field(default_factory=dict)
    decide_us: float = 0.0  # the signals' time (what the decision costs in the request path)


def article_of(doc_id: str) -> str:
    return doc_id.split("#", 1)[0]


def write_corpus(rows: Iterable[dict[str, object]], path: Path) -> Path:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def index_corpus(corpus: Path, root: Path) -> None:
    """As `ragserve-index build` does with its defaults (incremental over the root's version)."""
    from indexer.build import build_index
    from indexer.embedding import load_embedder
    from ragserve.config import EmbedderSettings

    defaults = EmbedderSettings()
    embedder = load_embedder(defaults.model, defaults.backend, defaults.device, defaults.onnx_int8)
    build_index(corpus, root, embedder, progress=False)


async def ask_all(root: Path, questions: list[tuple[str, str, str]], group: str) -> list[Asked]:
    """(qid, question, kind) retrieved through the pipeline over `root`, each with its signals."""
    from ragserve.factory.pipeline import make_pipeline

    settings = Settings(
        index=IndexSettings(path=root),
        answer=AnswerSettings(generation_enabled=False),
        cache=CacheSettings(backend="off"),  # every question retrieved afresh
    )
    top_k, budget = RequestSettings().default_top_k, RequestSettings().retrieval_budget_ms
    pipeline = make_pipeline(settings, with_generator=False)
    out: list[Asked] = []
    async with pipeline:
        for qid, text, kind in questions:
            result = await pipeline.retrieve(RetrieveParams(text, top_k, budget), RequestContext(Deadline(budget)))
            table = SentenceTable.of(text, [p.chunk for p in result.passages])  # Query has it already
            started = time.perf_counter()
            values = {name: signal(result, table) for name, signal in SIGNALS.items()}
            spent = (time.perf_counter() - started) * 1e6
            out.append(Asked(qid, group, kind, values, spent))
    return out


def leave_one_out(
    folder: Path, work: Path, covered_per_article: int, adversarial: bool = False, seed: int = 0
) -> list[Asked]:
    """Every article of a SQuAD-format folder that has questions left out in turn (see the module's
    docstring). `adversarial`: also the served articles' unanswerable questions ("adversarial")."""
    squad = load_squad(folder)
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines() if line.strip()]
    by_article: dict[str, list[SquadQuestion]] = {}
    for q in squad.questions:
        by_article.setdefault(article_of(q.doc_id), []).append(q)
    articles = sorted({article_of(str(r["_id"])) for r in corpus} & set(by_article))  # those asked about
    rng = random.Random(seed)
    rows: list[Asked] = []
    root = work / "index"
    for article in articles:
        served = write_corpus((r for r in corpus if article_of(str(r["_id"])) != article), work / "corpus.jsonl")
        index_corpus(served, root)
        asked = [(q.qid, q.question, "impossible" if q.impossible else "absent") for q in by_article[article]]
        for other in articles:
            if other != article:
                answerable = [q for q in by_article.get(other, []) if not q.impossible]
                picked = rng.sample(answerable, min(covered_per_article, len(answerable)))
                asked += [(q.qid, q.question, "covered") for q in picked]
                if adversarial:
                    asked += [(q.qid, q.question, "adversarial") for q in by_article[other] if q.impossible]
        rows += asyncio.run(ask_all(root, asked, article))
        log.info("left out %s: %d questions asked", article, len(asked))
    return rows


def leave_one_out_in(
    folder: Path, covered_per_article: int, work: Path | None = None, adversarial: bool = False
) -> list[Asked]:
    """`leave_one_out` in `work`, else in a temporary folder."""
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
        rows = leave_one_out(folder, work, covered_per_article, adversarial)
        # Kept to fit again without asking again (`tune-decline --rows`).
        (work / "rows.json").write_text(json.dumps({"rows": [dataclasses.asdict(r) for r in rows]}))
        return rows
    with tempfile.TemporaryDirectory(prefix="ragserve-decline-") as tmp:
        return leave_one_out(folder, Path(tmp), covered_per_article, adversarial)


def read_rows(path: Path) -> list[Asked]:
    """The rows a run kept (`leave_one_out_in`'s rows.json, or bench_decline.py's results.json)."""
    try:
        return [Asked(**row) for row in json.loads(path.read_text())["rows"]]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} holds no decline rows: {exc}") from None
