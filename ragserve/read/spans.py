"""From a span head's logits to one answer span per passage (SQuAD 2.0 decoding), shared by the
ONNX reader and the trainer's held-out evaluation so both decode alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The longest answer considered, in tokens (SQuAD's usual limit).
MAX_ANSWER_TOKENS = 30


@dataclass(frozen=True, slots=True)
class TokenSpan:
    first: int  # token index of the span's first token
    last: int  # token index of its last token (inclusive)
    score: float  # start_logits[first] + end_logits[last]; -inf when no passage token exists
    null_score: float  # start_logits[0] + end_logits[0] ([CLS])


def best_token_span(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    passage_first: int,
    passage_last: int,
    max_answer_tokens: int = MAX_ANSWER_TOKENS,
) -> TokenSpan:
    """The highest start + end over spans inside passage tokens [passage_first, passage_last] with
    first <= last < first + max_answer_tokens; and the [CLS] null score."""
    null = float(start_logits[0] + end_logits[0])
    if passage_last < passage_first:
        return TokenSpan(0, 0, float("-inf"), null)
    s = np.asarray(start_logits[passage_first : passage_last + 1], dtype=np.float64)
    e = np.asarray(end_logits[passage_first : passage_last + 1], dtype=np.float64)
    n = len(s)
    pair = s[:, None] + e[None, :]
    offset = np.arange(n)[None, :] - np.arange(n)[:, None]  # last - first
    pair[(offset < 0) | (offset >= max_answer_tokens)] = -np.inf
    flat = int(np.argmax(pair))
    first, last = divmod(flat, n)
    return TokenSpan(passage_first + first, passage_first + last, float(pair[first, last]), null)
