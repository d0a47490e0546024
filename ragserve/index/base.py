"""The search contract every index backend meets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.types import Chunk


@dataclass(frozen=True, slots=True)
class ScoredChunk:
    chunk: Chunk
    score: float


@runtime_checkable
class SearchIndex(Protocol):
    """A loaded, read-only index: dense search over chunk embeddings plus the chunk texts."""

    @property
    def version(self) -> str: ...

    @property
    def count(self) -> int: ...

    @property
    def embedder_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def search(self, query_vector: np.ndarray, k: int, ef: int) -> list[ScoredChunk]:
        """The k nearest chunks by cosine similarity; `ef` trades recall for time."""
        ...
