"""The extractive reader on ONNX Runtime (int8 dynamic quantization, CPU).

(question, passage) pairs are tokenized as [CLS] question [SEP] passage [SEP] by the folder's fast
tokenizer (read/tokenizing.py), the passage truncated to the model's `max_length`; each batch is
padded to its longest pair. The tokenizer's offsets are Python str indices, i.e. code points, so a
span maps straight back to `passage[start:end]`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.onnx_export import BERT_INPUTS
from ragserve.pretrained import check_model_file_size
from ragserve.read.base import ReadSpan
from ragserve.read.cost import CostSample, ReadCost
from ragserve.read.folder import (
    DEFAULT_READER_DIR,
    MAX_QUESTION_TOKENS,
    OUTPUT,
    ReaderLoadError,
    ReaderSpec,
    read_spec,
)
from ragserve.read.spans import best_token_span
from ragserve.read.tokenizing import PairBatch, ReaderTokenizer

# Passages per ONNX Runtime call.
BATCH_SIZE = 4
# The load-time cost measurement: a passage of about one chunk, read alone and four at a time.
_PROBE_PASSAGE = " ".join(["The committee met in the old town hall to discuss the harbour."] * 14)
_PROBE_ROUNDS = 3


class OnnxReader:
    """A `Reader` over a reader folder (see folder.py). Thread-safe: calls share one session."""

    def __init__(self, spec: ReaderSpec, tokenizer: ReaderTokenizer, session: Any, measure_cost: bool = True) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self._session = session
        self._inputs = {i.name for i in session.get_inputs()}
        self._model_id = f"{spec.name}+{spec.onnx_sha256[:16]}"
        self._cost = self._measure() if measure_cost else ReadCost(1.0)

    @classmethod
    def from_folder(
        cls, folder: Path | str = DEFAULT_READER_DIR, threads: int = 2, measure_cost: bool = True
    ) -> OnnxReader:
        """Load and check a reader folder (the shipped default unless told otherwise); a folder that
        does not match its manifest, or whose model does not run, raises ReaderLoadError."""
        folder = Path(folder)
        spec = read_spec(folder)
        try:
            check_model_file_size(spec.onnx)
            tokenizer = ReaderTokenizer(folder, spec.max_length)
            session = _session(spec.onnx, threads)
        except ReaderLoadError:
            raise
        except Exception as exc:  # tokenizer and ONNX Runtime errors come in many types: one clear refusal
            raise ReaderLoadError(f"reader at {folder}: cannot be loaded: {type(exc).__name__}: {exc}") from exc
        names = {o.name for o in session.get_outputs()}
        if OUTPUT not in names or not {i.name for i in session.get_inputs()} <= set(BERT_INPUTS):
            raise ReaderLoadError(f"reader at {folder}: the model's inputs/outputs are not a BERT span head's")
        reader = cls(spec, tokenizer, session, measure_cost=False)
        try:
            probe = reader.read("a question", [_PROBE_PASSAGE])
        except Exception as exc:
            raise ReaderLoadError(f"reader at {folder}: the model does not run: {exc}") from exc
        if not (np.isfinite(probe[0].score) and np.isfinite(probe[0].null_score)):
            raise ReaderLoadError(f"reader at {folder}: the model does not give finite span scores")
        if measure_cost:
            reader._cost = reader._measure()
        return reader

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def no_answer_threshold(self) -> float:
        return self._spec.no_answer_threshold

    @property
    def max_length(self) -> int:
        return self._spec.max_length

    @property
    def manifest(self) -> dict[str, Any]:
        return self._spec.manifest

    @property
    def cost(self) -> ReadCost:
        return self._cost

    def read(self, question: str, passages: Sequence[str]) -> list[ReadSpan]:
        if not passages:
            return []
        started = time.perf_counter()
        question = self._cut_question(question)
        out: list[ReadSpan] = []
        for at in range(0, len(passages), BATCH_SIZE):
            out.extend(self._read_batch(question, passages[at : at + BATCH_SIZE], at))
        self._cost.observe(len(passages), (time.perf_counter() - started) * 1000)
        return out

    def logits(self, question: str, passages: Sequence[str]) -> tuple[PairBatch, np.ndarray]:
        """The tokenized batch and its (batch, seq, 2) span logits; for evaluation and tests."""
        enc = self._tokenizer.pairs(question, passages)
        feed = {name: enc.inputs[name] for name in BERT_INPUTS if name in self._inputs}
        (span_logits,) = self._session.run([OUTPUT], feed)
        return enc, np.asarray(span_logits, dtype=np.float32)

    def _read_batch(self, question: str, passages: Sequence[str], first_index: int) -> list[ReadSpan]:
        enc, span_logits = self.logits(question, passages)
        spans = []
        for row, passage in enumerate(passages):
            ids = enc.sequence_ids(row)
            inside = [i for i, s in enumerate(ids) if s == 1]
            first, last = (inside[0], inside[-1]) if inside else (1, 0)
            best = best_token_span(
                span_logits[row, :, 0], span_logits[row, :, 1], first, last, self._spec.max_answer_tokens
            )
            if best.score == float("-inf"):
                spans.append(ReadSpan(first_index + row, 0, 0, "", best.score, best.null_score))
                continue
            offsets = enc.offsets(row)
            start, end = offsets[best.first][0], offsets[best.last][1]
            spans.append(ReadSpan(first_index + row, start, end, passage[start:end], best.score, best.null_score))
        return spans

    def _cut_question(self, question: str) -> str:
        offsets = self._tokenizer.offsets(question)
        if len(offsets) <= MAX_QUESTION_TOKENS:
            return question
        return question[: offsets[MAX_QUESTION_TOKENS - 1][1]]

    def _measure(self) -> ReadCost:
        samples = []
        for _ in range(_PROBE_ROUNDS):
            for n in (1, BATCH_SIZE):
                started = time.perf_counter()
                self._read_batch("What did the committee discuss?", [_PROBE_PASSAGE] * n, 0)
                samples.append(CostSample(n, (time.perf_counter() - started) * 1000))
        return ReadCost.fit(samples)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning workers would steal the cores the generator and the embedder run on.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
