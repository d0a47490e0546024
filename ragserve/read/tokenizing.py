"""The reader's tokenizer, opened straight from its folder's tokenizer.json with Hugging Face's
`tokenizers`: what transformers' fast tokenizer runs underneath, without importing transformers
(with torch behind it), which cost every server start about 5 s of CPU (BENCHMARKS.md, "What a
server start costs").

Pairs are [CLS] question [SEP] passage [SEP], the passage truncated to `max_length`, a batch padded
to its longest pair: what `AutoTokenizer(..., truncation="only_second", padding="longest")` gives
(tests/read/test_reader_tokenizer.py compares them). Offsets are Python str indices.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer


class PairBatch:
    """A tokenized batch of (question, passage) pairs: the model's inputs and each row's offsets."""

    def __init__(self, encodings: Sequence[Encoding]) -> None:
        self._encodings = list(encodings)
        self.inputs = {
            "input_ids": np.array([e.ids for e in self._encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in self._encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in self._encodings], dtype=np.int64),
        }

    def sequence_ids(self, row: int) -> list[int | None]:
        """Per token: 0 the question, 1 the passage, None a special or padding token."""
        return list(self._encodings[row].sequence_ids)

    def offsets(self, row: int) -> list[tuple[int, int]]:
        """Per token: its (start, end) in the text it came from."""
        return [(int(a), int(b)) for a, b in self._encodings[row].offsets]


class ReaderTokenizer:
    """Thread-safe: one lock around each call (encoding is quick; the model call is not under it)."""

    def __init__(self, folder: Path, max_length: int) -> None:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path.name} is missing: the reader needs a fast tokenizer for character offsets")
        plain = Tokenizer.from_file(str(path))
        pad_token = _pad_token(folder)
        pad_id = plain.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"the tokenizer has no padding token {pad_token!r}")
        self._pairs = Tokenizer.from_str(plain.to_str())
        self._pairs.enable_truncation(max_length, strategy="only_second")
        self._pairs.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_type_id=0)
        plain.no_truncation()
        plain.no_padding()
        self._plain = plain
        self._lock = threading.Lock()

    def pairs(self, question: str, passages: Sequence[str]) -> PairBatch:
        with self._lock:
            return PairBatch(self._pairs.encode_batch([(question, p) for p in passages]))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's (start, end) in `text`, no special tokens."""
        with self._lock:
            return [(int(a), int(b)) for a, b in self._plain.encode(text, add_special_tokens=False).offsets]


def _pad_token(folder: Path) -> str:
    """The padding token tokenizer_config.json names ([PAD], BERT's, when it names none)."""
    config = folder / "tokenizer_config.json"
    data: Any = json.loads(config.read_text()) if config.is_file() else {}
    token = data.get("pad_token") if isinstance(data, dict) else None
    if isinstance(token, dict):  # the older format: {"content": "[PAD]", ...}
        token = token.get("content")
    return token if isinstance(token, str) and token else "[PAD]"
