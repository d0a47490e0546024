"""Domain values shared by the pipeline, the backends and the protocol adapters."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ragserve.filters import Filter, both
from ragserve.sentence_spans import PassageSentences
from ragserve.source_location import SourceLocation


def model_name(model: str) -> str:
    """What callers may see of a configured model: a hub id as it is, a local folder by its name
    only (the server's file system layout is not theirs to learn; the server log has the path)."""
    local = model.startswith(("/", ".", "~")) or "\\" in model or model[1:2] == ":"
    return re.split(r"[\\/]", model.rstrip("/\\"))[-1] if local else model


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a source document, as stored in the docstore (`sentences`: as analysed at indexing)."""

    chunk_id: str
    doc_id: str
    text: str
    title: str = ""
    source: str = ""
    start: int = 0
    end: int = 0
    # The document's filterable fields (manifest `fields`; values as ragserve/filters.py stores them).
    metadata: dict[str, Any] = field(default_factory=dict)
    sentences: PassageSentences | None = field(default=None, compare=False, repr=False)
    # None: a version built before chunks recorded where they stand (its citations say so).
    location: SourceLocation | None = None


@dataclass(frozen=True, slots=True)
class Highlight:
    """Evidence, not an answer: the sentence of a passage that best matches the question, by its
    character offsets in the passage text, and the share of the question's weight it holds (0..1)."""

    start: int
    end: int
    coverage: float


@dataclass(frozen=True, slots=True)
class AnswerSpan:
    """The reader's answer: a span of one passage (code point offsets into its text, end exclusive),
    the sentence holding it, and how far the reader believes it over "the documents don't say"."""

    passage: int  # position in the request's passages
    start: int
    end: int
    text: str
    margin: float  # span score minus no-answer score
    answers: bool  # the margin reaches the reader's threshold
    sentence_start: int
    sentence_end: int


@dataclass(frozen=True, slots=True)
class Passage:
    """A retrieved chunk with its score, in the order it is given to the prompt."""

    chunk: Chunk
    score: float
    rank: int = 0
    # Set per request (never cached: it depends on the question's words).
    highlight: Highlight | None = None
    # Its raw scores before fusion (cosine, BM25; not among a list's candidates: that list's last
    # score, a bound; None: that list was not searched): the decline reads them, since a fused
    # score is only relative to the other candidates.
    dense: float | None = None
    lexical: float | None = None


@dataclass(frozen=True, slots=True)
class Support:
    """How well the retrieved passages support an answer: the best highlight's coverage, and
    whether that is below the server's threshold (the documents likely do not answer); and which
    passage's highlight to show as the evidence."""

    coverage: float
    low: bool
    evidence_passage: int = 0


@dataclass(slots=True)
class StageTimings:
    """Milliseconds per stage, each recorded once and reused for responses, metrics and logs."""

    embed_ms: float = 0.0
    search_ms: float = 0.0
    rerank_ms: float = 0.0
    retrieval_total_ms: float = 0.0
    prompt_ms: float = 0.0
    ttft_ms: float = 0.0
    generation_ms: float = 0.0
    total_ms: float = 0.0
    time_per_output_token_ms: float = 0.0
    cache_ms: float = 0.0  # retrieval cache lookups (exact, and semantic when enabled)
    answer_cache_ms: float = 0.0
    context_ms: float = 0.0  # fitting the passages into the context token budget
    engine_wait_ms: float = 0.0  # a batch request waiting for its share of the engine
    evidence_ms: float = 0.0  # highlights and support (request/evidence.py), within retrieval_total_ms
    reader_ms: float = 0.0  # the extractive reader (request/reading.py), however it overlapped the rest


@dataclass(frozen=True, slots=True)
class Degraded:
    """What was cut short to hold the budget; a degraded request still succeeds.

    Built only by the two constructors below, one per way a passage list comes about, then
    extended (`noted`, `remarked`) by what the request path adds to it.
    """

    budget_exhausted: bool = False
    search_truncated: bool = False
    rerank_skipped: bool = False
    rerank_truncated: bool = False
    notes: tuple[str, ...] = ()
    # What the caller should know that cut nothing short (reported with the notes; not degraded).
    remarks: tuple[str, ...] = ()

    @classmethod
    def of_cache_hit(cls, semantic: bool, cut_short: bool) -> Degraded:
        notes = []
        if semantic:
            # Never the other query's text: it is another caller's question.
            notes.append("passages reused from a near-duplicate earlier query (semantic cache)")
        if cut_short:
            notes.append("cached passages come from a ranking that was cut short by the budget")
        return cls(notes=tuple(notes))

    @classmethod
    def of_search(
        cls,
        *,
        breadth_cut: bool,
        lexical_missing: bool,
        rerank_skipped: bool,
        rerank_truncated: bool,
        rerank_notes: tuple[str, ...],
        budget_exhausted: bool,
    ) -> Degraded:
        notes = rerank_notes
        if breadth_cut:
            notes = ("search breadth cut to the results asked for: budget nearly spent after embedding", *notes)
        remarks = ("the index has no lexical (BM25) part: retrieval ran dense-only",) if lexical_missing else ()
        return cls(budget_exhausted, breadth_cut, rerank_skipped, rerank_truncated, notes, remarks)

    def noted(self, note: str) -> Degraded:
        return dataclasses.replace(self, notes=(*self.notes, note))

    def remarked(self, remark: str) -> Degraded:
        return dataclasses.replace(self, remarks=(*self.remarks, remark))

    def is_degraded(self) -> bool:
        """True when anything was cut short (such a result is not cached)."""
        return bool(
            self.budget_exhausted or self.search_truncated or self.rerank_skipped or self.rerank_truncated or self.notes
        )


class RequestClass(StrEnum):
    """Who waits for a request: a person (interactive, the default) or a job (batch). Batch takes at
    most a share of the in-flight slots and of the engine, is shed first, and runs after interactive
    work in the engine's queue."""

    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def engine_priority(self) -> int:
        """vLLM's priority scheduling runs lower values first."""
        return 0 if self is RequestClass.INTERACTIVE else 1


# Warming's prefills run after every Query's work, batch included, where the engine schedules by priority.
WARMING_ENGINE_PRIORITY = 2


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier turn of a conversation: who spoke ("user" or "assistant") and what was said."""

    role: str
    text: str


@dataclass(frozen=True, slots=True)
class RetrieveParams:
    """A validated retrieval request."""

    query: str
    top_k: int
    budget_ms: int
    # At most one passage per source document.
    dedupe_documents: bool = False
    # The caller's filter, checked against the index version's fields (None: the whole corpus).
    filter: Filter | None = None
    # What the caller may read (its access grant, set by the server, never by the caller): None
    # where access control is off or the caller may read everything.
    grant: Filter | None = None
    # A conversation's latest user turns, newest first, that retrieval searches with beside the
    # question (bounded by the server), and the question's share of the query vector when there are
    # any (RAGSERVE_HISTORY_QUESTION_WEIGHT). Both change the passages, so both enter cache keys.
    recent: tuple[str, ...] = ()
    question_weight: float = 1.0

    @property
    def narrowing(self) -> Filter | None:
        """What search must keep to: the caller's filter within its grant."""
        return both(self.filter, self.grant)

    @property
    def search_text(self) -> str:
        """What the reranker and the evidence read, and the second text the query vector blends in:
        the question, then the recent user turns (a follow-up's "it" is named there)."""
        return "\n".join((self.query, *self.recent))

    @property
    def lexical_text(self) -> str:
        """What lexical search reads: with recent turns, the question twice, so BM25 counts its
        terms double and an unrelated earlier turn cannot outweigh them (BENCHMARKS.md,
        "Conversations and the OpenAI door")."""
        return "\n".join((self.query, self.query, *self.recent)) if self.recent else self.query


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """A validated generation request."""

    max_tokens: int
    temperature: float
    # Most passage tokens in the prompt (sentences that match the question); 0: whole passages.
    context_token_budget: int = 0
    # The engine's scheduling priority (lower first), from the request's class (RequestContext).
    priority: int = 0
    # The conversation's latest turns the prompt quotes before the question, oldest first (bounded
    # by the server): the answer depends on them, so the answer cache keys on them.
    history: tuple[Turn, ...] = ()


@dataclass(slots=True)
class RetrievalResult:
    passages: list[Passage]
    timings: StageTimings
    degraded: Degraded
    index_version: str
    rerank_tiers: list[str] = field(default_factory=list)
    # Served from the retrieval cache: embedding, search and rerank were skipped.
    cache_hit: bool = False
    # The identity of the index version the passages came from (SearchIndex.identity): an answer is
    # keyed on it, and so is a reading of its passages.
    index_identity: str = ""
    # Set per request with the passages' highlights (request/evidence.py).
    support: Support | None = None
    # The reader's span, when it finished before this result was sent (request/reading.py).
    answer: AnswerSpan | None = None


@dataclass(frozen=True, slots=True)
class ShippedModel:
    """A model an index version ships, its files checked (index/shipped.py): plain paths and values
    for embed/ and rerank/, which never read a version folder themselves."""

    version_folder: Path  # for messages: which version it came from
    onnx: Path  # the ONNX int8 model file
    files: Path  # its folder (config.json, tokenizer files)
    base: str  # the model it was tuned from
    sha256: str  # the ONNX file's digest, as the manifest lists it
    spec: dict[str, Any]  # the manifest's entry, each key of its checked type
