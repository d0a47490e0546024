"""SQuAD-format folders for the reader: `corpus.jsonl` (BEIR paragraphs, `_id` "Article#n") and
`questions.jsonl` (`question`, `answers`, `answer_starts` in code points of the paragraph text,
`impossible`, `doc_id`), and the training examples made from them."""

from __future__ import annotations

import json
import random
import re
import string
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from indexer.tune.evaluation import TuneInputError


@dataclass(frozen=True, slots=True)
class SquadQuestion:
    qid: str
    question: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]  # empty when the folder gives none (e.g. a dev set)
    impossible: bool
    doc_id: str


@dataclass(frozen=True, slots=True)
class SquadSet:
    name: str
    paragraphs: dict[str, str]  # doc_id -> text
    questions: list[SquadQuestion]


@dataclass(frozen=True, slots=True)
class SpanExample:
    """One training pair; `answer_start` None teaches "no answer" ([CLS])."""

    question: str
    paragraph: str
    answer_start: int | None
    answer_text: str


def _jsonl(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        raise TuneInputError(f"{path} is missing (a SQuAD-format folder holds corpus.jsonl and questions.jsonl)")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TuneInputError(f"{path}:{n}: not JSON: {exc}") from exc
    return rows


def load_squad(folder: Path) -> SquadSet:
    paragraphs = {str(r["_id"]): str(r["text"]) for r in _jsonl(folder / "corpus.jsonl")}
    questions = []
    for r in _jsonl(folder / "questions.jsonl"):
        doc = str(r["doc_id"])
        if doc not in paragraphs:
            raise TuneInputError(f"{folder}: question {r.get('id')} names paragraph {doc!r}, not in corpus.jsonl")
        answers = tuple(str(a) for a in r.get("answers") or [])  # type: ignore[attr-defined]
        starts = tuple(int(s) for s in r.get("answer_starts") or [])  # type: ignore[attr-defined]
        questions.append(
            SquadQuestion(str(r["id"]), str(r["question"]), answers, starts, bool(r.get("impossible")), doc)
        )
    if not questions:
        raise TuneInputError(f"{folder}: questions.jsonl holds no questions")
    return SquadSet(folder.name, paragraphs, questions)


def article(doc_id: str) -> str:
    return doc_id.rsplit("#", 1)[0]


def training_examples(data: SquadSet, negative_share: float, seed: int) -> list[SpanExample]:
    """Answerable questions with their first gold span; unanswerable ones as "no answer"; and for
    `negative_share` of the answerable ones, the question against another paragraph of the same
    article (of the corpus if the article has one paragraph) that does not hold the answer, as
    "no answer" too. SQuAD 2.0's own unanswerable questions are adversarial and few: without these,
    the head never learns that an off-topic passage does not answer."""
    rng = random.Random(seed)
    by_article: dict[str, list[str]] = defaultdict(list)
    for doc in data.paragraphs:
        by_article[article(doc)].append(doc)
    every = list(data.paragraphs)
    out: list[SpanExample] = []
    for q in data.questions:
        text = data.paragraphs[q.doc_id]
        if q.impossible or not q.answers:
            out.append(SpanExample(q.question, text, None, ""))
            continue
        start = q.answer_starts[0] if q.answer_starts else text.find(q.answers[0])
        if start < 0 or text[start : start + len(q.answers[0])] != q.answers[0]:
            continue  # a span that is not where it is said to be teaches nothing
        out.append(SpanExample(q.question, text, start, q.answers[0]))
        if rng.random() < negative_share:
            pool = [d for d in by_article[article(q.doc_id)] if d != q.doc_id] or [d for d in every if d != q.doc_id]
            for _ in range(3):
                other = rng.choice(pool) if pool else None
                if other and not any(normalize(a) in normalize(data.paragraphs[other]) for a in q.answers):
                    out.append(SpanExample(q.question, data.paragraphs[other], None, ""))
                    break
    return out


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, spaces collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())
