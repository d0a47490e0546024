"""Cross-encoder tiers: what both backends share (tokenizing pairs, padding) and the torch one
(onnx_cross_encoder.py: ONNX Runtime, int8 dynamic quantization on CPU).

Both tokenize with the model's own tokenizer, truncate pairs to a max sequence length matched to
the chunk size, and pad each batch only to its own longest pair.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ragserve.config import RerankSettings, default_of
from ragserve.errors import ConfigError
from ragserve.pretrained import load_options
from ragserve.rerank.base import EncodedPair

log = logging.getLogger(__name__)

# Written into the config of the architecture-identical test models (random classification heads).
RANDOM_HEAD_MARKER = "ragserve_random_head"
# Passages whose token ids are kept (about 1 KB each at 200 tokens).
PASSAGE_CACHE_SIZE = 50_000


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run the calling thread on `cpus` for the duration (Linux: affinity is per thread)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def load_error(model: str, setting: str, exc: BaseException) -> ConfigError:
    return ConfigError(
        f"cannot load reranker model {model!r} (set by {setting}): {type(exc).__name__}: {str(exc).rstrip('.')}. "
        "Point the setting at an HF id or a local folder that holds a cross-encoder, "
        "or set RAGSERVE_RERANK_MODE=off"
    )


class TokenizingEncoder:
    """Shared by both backends: the model's tokenizer, pair encoding and dynamic padding."""

    _tokenizer: Any
    _tokenizer_lock: threading.Lock
    _max_seq_len: int

    def _load_tokenizer(self, model: str, setting: str) -> None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model, **load_options(model))
        except Exception as exc:  # transformers raises OSError, ValueError, hub errors...
            raise load_error(model, setting, exc) from exc
        self._use_tokenizer(tokenizer)

    def _use_tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._pad_id = int(self._tokenizer.pad_token_id or 0)
        # A fast tokenizer sets its truncation state per call: concurrent calls fail with "Already borrowed".
        self._tokenizer_lock = threading.Lock()
        # Tokenizing a 200-token passage costs about as much as scoring it with a 2-layer model on a
        # busy CPU, and popular chunks come back: keep their token ids (without special tokens).
        self._passage_ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_size = PASSAGE_CACHE_SIZE
        self._bert_pairs = self._is_bert_pair_template()

    def _describe(self, model: str, config: Any, max_seq_len: int, cpus: frozenset[int] | None) -> None:
        """What both backends report, and how long a pair may be (never past the model's positions)."""
        self._model_id = model
        self._max_seq_len = min(max_seq_len, int(getattr(config, "max_position_embeddings", max_seq_len)))
        self._random_head = bool(getattr(config, RANDOM_HEAD_MARKER, False))
        self._cpus = cpus

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def random_head(self) -> bool:
        return self._random_head

    def _is_bert_pair_template(self) -> bool:
        """True when pairs are [CLS] q [SEP] p [SEP] with type ids 0/1: then cached ids can be assembled."""
        tok = self._tokenizer
        cls, sep = getattr(tok, "cls_token_id", None), getattr(tok, "sep_token_id", None)
        if cls is None or sep is None:
            return False
        q = tok("query", add_special_tokens=False)["input_ids"]
        p = tok("passage text", add_special_tokens=False)["input_ids"]
        probe = tok("query", "passage text", return_token_type_ids=True)
        return bool(
            probe["input_ids"] == [cls, *q, sep, *p, sep]
            and probe["token_type_ids"] == [0] * (len(q) + 2) + [1] * (len(p) + 1)
        )

    def _ids(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        with self._tokenizer_lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._passage_ids]
            if missing:
                found = self._tokenizer(missing, add_special_tokens=False, truncation=False)["input_ids"]
                for text, ids in zip(missing, found, strict=True):
                    self._passage_ids[text] = tuple(ids)
            out = []
            for t in texts:
                self._passage_ids.move_to_end(t)
                out.append(self._passage_ids[t])
            while len(self._passage_ids) > self._cache_size:
                self._passage_ids.popitem(last=False)
        return out

    def encode(self, query: str, texts: Sequence[str]) -> list[EncodedPair]:
        if not texts:
            return []
        if self._bert_pairs:
            return self._encode_bert(query, texts)
        with self._tokenizer_lock:
            enc = self._tokenizer(
                [query] * len(texts),
                list(texts),
                truncation="longest_first",
                max_length=self._max_seq_len,
                padding=False,
                return_token_type_ids=True,
                return_attention_mask=False,
            )
        pairs = zip(enc["input_ids"], enc["token_type_ids"], strict=True)
        return [EncodedPair(tuple(ids), tuple(types)) for ids, types in pairs]

    def _encode_bert(self, query: str, texts: Sequence[str]) -> list[EncodedPair]:
        with self._tokenizer_lock:
            q_all = tuple(self._tokenizer(query, add_special_tokens=False)["input_ids"])
        cls, sep = self._tokenizer.cls_token_id, self._tokenizer.sep_token_id
        room = self._max_seq_len - 3
        out = []
        for p_all in self._ids(texts):
            # "longest_first" truncation: the longer side gives up tokens until the pair fits.
            nq, np_ = len(q_all), len(p_all)
            if nq + np_ > room:
                if nq <= room // 2:
                    np_ = room - nq
                elif np_ <= room // 2:
                    nq = room - np_
                else:
                    nq, np_ = room - room // 2, room // 2
            ids = (cls, *q_all[:nq], sep, *p_all[:np_], sep)
            out.append(EncodedPair(ids, (0,) * (nq + 2) + (1,) * (np_ + 1)))
        return out

    def _pad(self, pairs: Sequence[EncodedPair]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        width = max(len(p) for p in pairs)
        ids = np.full((len(pairs), width), self._pad_id, dtype=np.int64)
        types = np.zeros((len(pairs), width), dtype=np.int64)
        mask = np.zeros((len(pairs), width), dtype=np.int64)
        for row, pair in enumerate(pairs):
            n = len(pair)
            ids[row, :n] = pair.input_ids
            types[row, :n] = pair.token_type_ids
            mask[row, :n] = 1
        return ids, mask, types


def relevance(logits: np.ndarray) -> np.ndarray:
    """One relevance logit per pair (ms-marco cross-encoders have one label)."""
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim == 2 and logits.shape[1] > 1:
        return np.asarray(logits[:, -1] - logits[:, 0], dtype=np.float32)
    return np.asarray(logits.reshape(-1), dtype=np.float32)


def read_config(model: str, setting: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model, **load_options(model))
    except Exception as exc:
        raise load_error(model, setting, exc) from exc


class TorchCrossEncoder(TokenizingEncoder):
    """A cross-encoder on torch, fp32 (CPU) or the checkpoint's dtype (CUDA)."""

    def __init__(
        self,
        model: str,
        setting: str,
        device: str = default_of(RerankSettings, "device"),
        max_seq_len: int = default_of(RerankSettings, "max_seq_len"),
        cpus: frozenset[int] | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        config = read_config(model, setting)
        self._load_tokenizer(model, setting)
        try:
            net = AutoModelForSequenceClassification.from_pretrained(model, **load_options(model))
        except Exception as exc:
            raise load_error(model, setting, exc) from exc
        self._net = net.to(device).eval()
        self._torch = torch
        self._device = device
        self._describe(model, config, max_seq_len, cpus)

    @property
    def backend(self) -> str:
        return f"torch-{self._device}"

    def score(self, pairs: Sequence[EncodedPair]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        torch = self._torch
        ids, mask, types = (torch.from_numpy(a).to(self._device) for a in self._pad(pairs))
        with pinned(self._cpus), torch.inference_mode():
            logits = self._net(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        return relevance(logits.float().cpu().numpy())
