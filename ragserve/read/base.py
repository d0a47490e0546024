"""The reader contract: what a caller gets for one question over a few passages.

A `Reader` scores each passage on its own: the best answer span in it, and a no-answer score (the
[CLS] position's start + end logits, SQuAD 2.0 style). `span_score - null_score` is the margin; a
passage "answers" when the margin is at least the reader's `no_answer_threshold`, which was chosen
on held-out questions when the model was trained (see the model's manifest.json).

    reader = OnnxReader.from_folder(DEFAULT_READER_DIR)
    spans = reader.read("Who discovered penicillin?", [passage_a, passage_b])
    best = max(spans, key=lambda s: s.margin)
    if best.answers(reader.no_answer_threshold):
        print(passages[best.passage][best.start : best.end])

`read` is blocking (one ONNX Runtime call per batch of passages): run it on the model threads,
never on the event loop. Its cost grows with the number of passages; `cost` predicts it so a caller
can choose how many passages fit its budget before calling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ragserve.read.cost import ReadCost


@dataclass(frozen=True, slots=True)
class ReadSpan:
    """The reader's answer for one passage.

    `start`/`end` are code point offsets (Python str indices) into that passage's text, end
    exclusive: `text == passages[passage][start:end]`. For a passage with no passage tokens left
    after truncation, the span is empty (start == end == 0) and `score` is -inf.
    """

    passage: int  # position in the `passages` given to `read`
    start: int
    end: int
    text: str
    score: float  # best span's start logit + end logit
    null_score: float  # [CLS] start logit + end logit: the passage does not answer

    @property
    def margin(self) -> float:
        """How much more the span is believed than "no answer"; compare with a no-answer threshold."""
        return self.score - self.null_score

    def answers(self, threshold: float) -> bool:
        """True when the span beats the no-answer score by at least `threshold`."""
        return self.margin >= threshold


@runtime_checkable
class Reader(Protocol):
    """An extractive reader. Thread-safe; blocking."""

    @property
    def model_id(self) -> str:
        """e.g. "ragserve-reader-minilm-l6+<sha256[:16]>" (the ONNX file's digest)."""
        ...

    @property
    def no_answer_threshold(self) -> float:
        """The margin below which a span is declined, as chosen on held-out questions."""
        ...

    @property
    def cost(self) -> ReadCost:
        """Milliseconds per passage, measured when the reader was loaded."""
        ...

    def read(self, question: str, passages: Sequence[str]) -> list[ReadSpan]:
        """One `ReadSpan` per passage, in the passages' order. Passages longer than the model's
        window are read up to it (the span is then found in the first part only)."""
        ...
