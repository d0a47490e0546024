"""A Query's prompt: its passages fitted to the context budget (request/context.py), the reader's
sentence quoted again before the question where the policy asks, and the layout that keeps the
prefix shared (prompt.py)."""

from __future__ import annotations

from typing import Protocol

from ragserve.budget import RequestContext
from ragserve.prompt import Prompt, build_prompt
from ragserve.request.context import FittedContext, fit_context
from ragserve.request.policy import AnswerPolicy
from ragserve.request.sentences import SentenceTable
from ragserve.types import AnswerSpan, Passage, Turn


class CountsTokens(Protocol):
    """What fitting the context needs of a generator: its tokenizer's count (the training data
    preparation fits prompts with the renderer alone, no engine)."""

    def count_tokens(self, text: str) -> int: ...


def fit_and_build(
    policy: AnswerPolicy,
    question: str,
    passages: list[Passage],
    table: SentenceTable,
    budget: int,
    generator: CountsTokens,
    request: RequestContext,
    span: AnswerSpan | None = None,
    warm_top: bool = False,
    history: tuple[Turn, ...] = (),
) -> tuple[FittedContext, Prompt]:
    """The passages fitted to the context budget, and the prompt. Off the event loop: a tokenizer
    call per sentence (and more at a large top_k) would stall every other stream while it runs.
    `warm_top`: warming pre-filled the top passage; `history`: the turns quoted before the question."""
    with request.stage("context"):
        context = fit_context(question, passages, budget, generator.count_tokens, policy.whole_first_max_tokens, table)
    with request.stage("prompt"):
        key = key_sentence(span, passages, context.passages) if policy.reader_lead else None
        layout = policy.prompt_layout
        whole_top = bool(passages and context.passages) and context.passages[0].chunk == passages[0].chunk
        if layout == "reusable" and not whole_top:
            layout = "stable"  # a top passage cut to the question is shared with no other question
        prompt = build_prompt(question, context.passages, layout, key, warm_top, history)
    return context, prompt


def key_sentence(span: AnswerSpan | None, read: list[Passage], kept: list[Passage]) -> tuple[int, str] | None:
    """The sentence holding a span that answers, with its passage's number in the prompt (None when
    there is no such span or its passage did not fit the context)."""
    if span is None or not span.answers or span.passage >= len(read):
        return None
    chunk = read[span.passage].chunk
    number = next((n for n, p in enumerate(kept, start=1) if p.chunk.chunk_id == chunk.chunk_id), None)
    return None if number is None else (number, chunk.text[span.sentence_start : span.sentence_end])
