"""The extractive reader on the request path: the answer span in the passages retrieval ranked first.

It runs on the model threads within its own budget, and reads as many of the best ranked passages
as its cost model says fit (at most `max_passages`). A Query starts it beside the generator's
prefill and never holds the first token for it: its span goes with the retrieval event when it is
done by then, else as one later event between the tokens (request/pipeline.py). A result belongs
to its question, its passages and their index version: readings are kept per process, keyed on
all three (the passages by their text, not only their ids: a chunk id survives an edit of its
document), never in a shared cache.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Hashable
from typing import Literal

from ragserve.budget import RequestContext
from ragserve.read.base import Reader, ReadSpan
from ragserve.request.model_threads import ModelThreads
from ragserve.request.sentences import analyse
from ragserve.types import AnswerSpan, Passage

# Where a request's reader runs before its results go out: within what is left of the retrieval
# budget (Retrieve), within the reader's own budget (Query, when the reader may abstain), or not.
ReadWithin = Literal["retrieval", "own", "none"]

log = logging.getLogger(__name__)

# Readings kept for questions asked again (the same passages of the same version).
_KEPT_READINGS = 1024

# Why a read gave no span ("" when it ran): the request's degraded notes say so.
SKIPPED = "reader skipped: no passage fits the time left for it"
FAILED = "reader failed (the server log says why): the passages are as retrieved"


class ReadingStage:
    def __init__(
        self,
        reader: Reader,
        threads: ModelThreads,
        max_passages: int,
        budget_ms: float,
        threshold: float | None = None,
        abstain: bool = False,
        beside_prefill: bool = False,
        highlight: bool = False,
    ) -> None:
        """`threshold`: the margin a span must reach to answer (None: the reader's own, chosen on
        held-out questions); `abstain`: a Query the reader finds no answer for is declined;
        `beside_prefill`: a Query's reader starts with the engine's prefill, not after the first
        token; `highlight`: a span that answers makes its sentence the highlight shown."""
        self.reader = reader
        self._threads = threads
        self._max_passages = max_passages
        self.budget_ms = budget_ms
        self.threshold = reader.no_answer_threshold if threshold is None else threshold
        self.abstain = abstain
        self.beside_prefill = beside_prefill
        self.highlight = highlight
        self._kept: OrderedDict[Hashable, AnswerSpan | None] = OrderedDict()

    @property
    def model_id(self) -> str:
        return self.reader.model_id

    def passages_within(self, budget_ms: float) -> int:
        """How many passages one read may take within `budget_ms` (and the reader's own budget)."""
        return min(self._max_passages, self.reader.cost.passages_within(min(budget_ms, self.budget_ms)))

    async def read(
        self,
        question: str,
        passages: list[Passage],
        index_identity: str,
        budget_ms: float,
        request: RequestContext,
        at_least_one: bool = False,
    ) -> tuple[AnswerSpan | None, float, str]:
        """(the best span of the passages read, or None; the ms it took; why it did not run, "" when
        it did: no passage fits `budget_ms` or there are none (SKIPPED), or the reader failed
        (FAILED: logged, never the request's failure)). `at_least_one`: the top passage is read
        whatever the budget (the span is then the only answer there is). The read adds its time to
        the request's `reader_ms` here, and nowhere else."""
        with request.stage("reader") as timer:
            span, not_read = await self._read(question, passages, index_identity, budget_ms, at_least_one)
        return span, timer.ms, not_read

    async def _read(
        self, question: str, passages: list[Passage], index_identity: str, budget_ms: float, at_least_one: bool
    ) -> tuple[AnswerSpan | None, str]:
        count = min(len(passages), max(int(at_least_one), self.passages_within(budget_ms)))
        if count == 0:
            return None, SKIPPED
        texts = [p.chunk.text for p in passages[:count]]
        key = (question, index_identity, tuple(p.chunk.chunk_id for p in passages[:count]), _digest(texts))
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key], ""
        try:
            spans = await self._threads.run(lambda: self.reader.read(question, texts))
            answer = self._best(spans, texts)
        except Exception:
            log.exception("the reader failed on a question over %d passages; answering without its span", count)
            return None, FAILED
        self._kept[key] = answer
        if len(self._kept) > _KEPT_READINGS:
            self._kept.popitem(last=False)
        return answer, ""

    def _best(self, spans: list[ReadSpan], texts: list[str]) -> AnswerSpan | None:
        """The span the reader believes most, with the sentence that holds it."""
        found = [s for s in spans if s.end > s.start]
        if not found:
            return None
        best = max(found, key=lambda s: (s.margin, -s.passage))
        sentence_start, sentence_end = _sentence_around(texts[best.passage], best.start, best.end)
        return AnswerSpan(
            passage=best.passage,
            start=best.start,
            end=best.end,
            text=best.text,
            margin=best.margin,
            answers=best.answers(self.threshold),
            sentence_start=sentence_start,
            sentence_end=sentence_end,
        )


def _digest(texts: list[str]) -> bytes:
    """The passages' content, short: a reading keyed on it is never given for edited text."""
    digest = hashlib.blake2b(digest_size=16)
    for text in texts:
        digest.update(len(text).to_bytes(8, "little"))
        digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


def _sentence_around(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence (or run of sentences) of `text` that holds [start, end)."""
    spans = analyse(text).spans
    first = max((s for s, _ in spans if s <= start), default=0)
    last = min((e for _, e in spans if e >= end), default=len(text))
    return first, last
