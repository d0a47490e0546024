"""How a Query's prompt is laid out and when the server declines to call the engine."""

from __future__ import annotations

from dataclasses import dataclass

from ragserve.config import AnswerSettings, WarmingSettings, default_of
from ragserve.events import DeclineEvidence
from ragserve.prompt import DECLINE_SENTENCE
from ragserve.request.decline import Decline, judge
from ragserve.request.sentences import SentenceTable
from ragserve.types import RetrievalResult

# The answer the system prompt asks the model to give when the passages do not hold one; the
# server gives the same words when it abstains itself.
ABSTAIN_ANSWER = DECLINE_SENTENCE


@dataclass(frozen=True, slots=True)
class AnswerPolicy:
    # "reusable": the top passage whole (its KV is reused by later questions that retrieve it first);
    # "stable": every passage cut to the question's sentences; "naive": a benchmark baseline only.
    prompt_layout: str = default_of(AnswerSettings, "prompt_layout")
    whole_passage_max_tokens: int = default_of(AnswerSettings, "prompt_whole_passage_max_tokens")
    low_support_below: float = default_of(AnswerSettings, "low_support_below")
    abstain_on_low_support: bool = default_of(AnswerSettings, "abstain_on_low_support")
    warm_passages: int = default_of(WarmingSettings, "warm_passages")
    warm_kv_share: float = default_of(WarmingSettings, "warm_kv_share")
    warm_whole_corpus: bool = default_of(WarmingSettings, "warm_whole_corpus")
    # The reader's sentence quoted before the question (RAGSERVE_READER_LEAD).
    reader_lead: bool = False
    # The decline before the generator (request/decline.py; None: off).
    decline: Decline | None = None

    @property
    def whole_first_max_tokens(self) -> int:
        """For the context fit: 0 unless the layout keeps the top passage whole."""
        return self.whole_passage_max_tokens if self.prompt_layout == "reusable" else 0

    @property
    def prompt_id(self) -> str:
        """What of the policy changes a prompt (the answer cache keys on it)."""
        lead = "+lead" if self.reader_lead else ""
        if self.prompt_layout == "reusable":
            return f"reusable:{self.whole_passage_max_tokens}{lead}"
        return self.prompt_layout + lead

    def declines(
        self, retrieval: RetrievalResult, table: SentenceTable, reader_abstains: bool
    ) -> tuple[bool, DeclineEvidence | None]:
        """Whether the server answers "the documents do not say" itself, before any engine call,
        and the decline model's evidence when it is what decided: the documents are not about the
        question (request/decline.py; no model call, microseconds), their lexical support is low,
        or the reader (when it may abstain) read the passages and found no answer."""
        judged = judge(self.decline, retrieval, table)
        if judged is not None:
            return True, judged
        support, span = retrieval.support, retrieval.answer
        if self.abstain_on_low_support and support is not None and support.low:
            return True, None
        return reader_abstains and span is not None and not span.answers, None
