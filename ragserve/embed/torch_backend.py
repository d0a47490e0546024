"""The torch backend: sentence-transformers (CPU or CUDA; the indexer's on a GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ragserve.config import EmbedderSettings, default_of
from ragserve.embed.base import NamedEmbedder, QueryEmbedding, fits_window, resolve_embedder_path
from ragserve.errors import ConfigError
from ragserve.pretrained import load_options


class SentenceTransformerEmbedder(NamedEmbedder):
    """all-MiniLM-L6-v2 (or any sentence-transformers model) on torch."""

    def __init__(
        self, model: str = default_of(EmbedderSettings, "model"), device: str = default_of(EmbedderSettings, "device")
    ) -> None:
        from sentence_transformers import SentenceTransformer

        path = resolve_embedder_path(model)
        try:
            self._model = SentenceTransformer(path, device=device, **load_options(path))
        except OSError as exc:
            raise ConfigError(f"cannot load embedder {model!r} (RAGSERVE_EMBEDDER_MODEL): {exc}") from exc
        # Renamed in sentence-transformers 6; keep working with older releases too.
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            raise ConfigError(f"embedder {model!r} does not report an embedding dimension")
        self._set_identity(model, int(dim))

    @property
    def backend(self) -> str:
        """How its vectors are made, as an index manifest records it (`embedder_backend`)."""
        return "torch"

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
