"""The answer stream's values: what a generator yields (GenerationChunk, its Usage) and the events
a Query streams after its retrieval (QueryEvent: tokens, citations, the reader's late span, the
final summary)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ragserve.source_location import SourceLocation, located_at
from ragserve.types import AnswerSpan, Chunk, Degraded, RequestClass, RetrievalResult, StageTimings


@dataclass(frozen=True, slots=True)
class TokenDelta:
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    prefix_cache_hit_tokens: int
    # Speculative decoding: draft tokens proposed, and how many of them the model accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """One step of a generator stream: new text and, on the last step, usage and finish reason."""

    text: str
    finished: bool = False
    finish_reason: str = ""
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class DeclineEvidence:
    """What led the server to decline before the generator: the decision's score (the fitted
    chance that the documents do not cover the question), the threshold it reached, its signals."""

    score: float
    threshold: float
    signals: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FinalSummary:
    usage: Usage
    timings: StageTimings
    degraded: Degraded
    finish_reason: str
    generator_model: str
    # Passage tokens in the prompt, after and before the context budget.
    context_tokens: int = 0
    context_tokens_full: int = 0
    answer_cache_hit: bool = False
    request_class: RequestClass = RequestClass.INTERACTIVE
    # The answer is the decline sentence: the generator's own, or the server's abstention.
    declined: bool = False
    # Why the server declined before the generator (request/decline.py); None otherwise.
    decline_evidence: DeclineEvidence | None = None
    # Every citation of the answer, as streamed; `unsupported`: some of the answer's content is held
    # by no passage (request/citations.py).
    citations: tuple[Citation, ...] = ()
    unsupported: bool = False


@dataclass(frozen=True, slots=True)
class Citation:
    """A marker `[n]` the answer wrote, located (request/citations.py): the answer text it
    supports (code points of the answer so far), the passage it names, the passage sentence it
    quotes by its characters in the source document's text, and whether that passage holds the
    supported text's content words (a lexical check, not a proof)."""

    marker: int  # n of [n]: the passage's rank
    answer_start: int
    answer_end: int
    passage: int  # index into the request's passages
    chunk: Chunk
    quote: str
    quote_start: int  # in the document's extracted text: chunk.start + the sentence's offset
    quote_end: int
    supported: bool

    @property
    def location(self) -> SourceLocation | None:
        """Where the quote stands in its source: its own page, not only its chunk's first."""
        return located_at(self.chunk.location, self.quote_start)


@dataclass(frozen=True, slots=True)
class LateAnswer:
    """The reader's span, when it finished after the retrieval event went out (between tokens)."""

    answer: AnswerSpan | None
    reader_ms: float


QueryEvent = RetrievalResult | TokenDelta | FinalSummary | LateAnswer | Citation
