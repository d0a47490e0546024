"""Sentences of a passage and how well each matches a question: no model call, a few microseconds each.

A passage's sentences and their stemmed content words are worked out once per chunk text and kept
in memory (`analyse`); a request only weighs its question's terms. A sentence scores the summed
rarity (IDF over the candidate sentences of one request) of the question's terms it contains. One
`SentenceTable` per request serves both the evidence shown (request/evidence.py) and the sentences
the context budget keeps (request/context.py), so the two always agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_EN_PLUS

from ragserve.sentence_spans import PassageSentences
from ragserve.types import Chunk

# A sentence ends at . ! or ? followed by space and something that starts a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATION_END = re.compile(r"\b(?:Dr|Mr|Mrs|Ms|Prof|St|Jr|Sr|Inc|Ltd|Co|vs|No|Fig|e\.g|i\.e|etc)\.$")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)

# Question words and function words carry no evidence of where the answer is.
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS) | {"many", "much", "also", "called", "known", "named"}
# A question term no candidate sentence holds weighs as if half a sentence held it: missing
# evidence for a rare word counts most against support.
_ABSENT_DF = 0.5


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def content_terms(text: str) -> set[str]:
    words = [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]
    return set(_stemmer().stemWords(words))


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each sentence in `text`, surrounding space excluded; a
    closing quote or bracket after the stop belongs to the sentence it ends."""
    pieces: list[tuple[int, int]] = []
    start = 0
    for boundary in _SENTENCE_END.finditer(text):
        gap = boundary.group(0)
        pieces.append((start, boundary.start() + len(gap) - len(gap.lstrip("\"')]"))))
        start = boundary.end()
    pieces.append((start, len(text)))
    spans: list[tuple[int, int]] = []
    for s, e in pieces:
        piece = text[s:e]
        if not piece.strip():
            continue
        s += len(piece) - len(piece.lstrip())
        e -= len(piece) - len(piece.rstrip())
        if spans and _ABBREVIATION_END.search(text[spans[-1][0] : spans[-1][1]]):
            spans[-1] = (spans[-1][0], e)  # "Dr. Smith" is one sentence
        else:
            spans.append((s, e))
    return spans


def split_sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


@dataclass(frozen=True, slots=True)
class QuestionWeights:
    """The question's terms and each one's rarity among one request's candidate sentences."""

    idf: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.idf.values())

    def score(self, terms: set[str] | frozenset[str]) -> float:
        return sum(weight for term, weight in self.idf.items() if term in terms)

    def coverage(self, terms: set[str] | frozenset[str]) -> float:
        """Share of the question's weight that `terms` hold (0..1; 0 for a question of stopwords)."""
        total = self.total
        return self.score(terms) / total if total > 0 else 0.0


def question_weights(question: str, sentence_terms: Sequence[set[str] | frozenset[str]]) -> QuestionWeights:
    n = len(sentence_terms)
    idf: dict[str, float] = {}
    for term in content_terms(question):
        df = sum(1 for terms in sentence_terms if term in terms)
        idf[term] = math.log(1.0 + max(n, 1) / (df or _ABSENT_DF))
    return QuestionWeights(idf)


# Chunks analysed at most once while they stay among the most recently retrieved.
_ANALYSED_CHUNKS = 32768


def analyse_text(text: str) -> PassageSentences:
    """`text` split into sentences, each stemmed (the indexer stores this with every chunk)."""
    spans = tuple(sentence_spans(text))
    return PassageSentences(spans, tuple(frozenset(content_terms(text[s:e])) for s, e in spans))


@lru_cache(maxsize=_ANALYSED_CHUNKS)
def analyse(text: str) -> PassageSentences:
    """`analyse_text`, once per text (a str caches its own hash: the lookup is cheap)."""
    return analyse_text(text)


def analysis_of(chunk: Chunk) -> PassageSentences:
    """What the indexer stored with the chunk, else its text analysed now (once while cached)."""
    return chunk.sentences if chunk.sentences is not None else analyse(chunk.text)


@dataclass(frozen=True, slots=True)
class SentenceTable:
    """One request's sentences over its passages (in retrieval order) and the question's weights."""

    passages: tuple[PassageSentences, ...]
    weights: QuestionWeights

    @classmethod
    def of(cls, question: str, chunks: Sequence[Chunk]) -> SentenceTable:
        passages = tuple(analysis_of(chunk) for chunk in chunks)
        return cls(passages, question_weights(question, [t for p in passages for t in p.terms]))

    def scores(self, passage: int) -> list[float]:
        return [self.weights.score(t) for t in self.passages[passage].terms]

    def coverages(self, passage: int) -> list[float]:
        return [self.weights.coverage(t) for t in self.passages[passage].terms]

    def best(self, passage: int) -> int | None:
        """The position of the passage's best sentence (ties: the earlier one); None without any."""
        scores = self.scores(passage)
        return max(range(len(scores)), key=lambda i: (scores[i], -i)) if scores else None
