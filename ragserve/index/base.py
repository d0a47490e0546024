"""The search contract every index backend meets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.filters import FieldSchema, Filter
from ragserve.types import Chunk


@dataclass(frozen=True, slots=True)
class ScoredChunk:
    chunk: Chunk
    score: float
    # After fusion: the chunk's raw cosine and BM25 score (None: that list was not searched).
    dense: float | None = None
    lexical: float | None = None


@runtime_checkable
class SearchIndex(Protocol):
    """A loaded, read-only index: dense search over chunk embeddings plus the chunk texts."""

    @property
    def version(self) -> str: ...

    @property
    def identity(self) -> str:
        """What this version holds (a hash of its content's description), not what it is numbered:
        two corpora at the same version number, or a root rebuilt from v1, never share it. Caches
        key on it."""
        ...

    @property
    def count(self) -> int: ...

    @property
    def embedder_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def search(self, query_vector: np.ndarray, k: int, ef: int, flt: Filter | None = None) -> list[ScoredChunk]:
        """The k nearest chunks by cosine similarity among those passing `flt` (checked against
        `fields`); `ef` trades recall for time. Fewer than k only when fewer pass."""
        ...

    @property
    def fields(self) -> FieldSchema:
        """The filterable metadata fields and their types (empty: this version takes no filter)."""
        ...

    def count_matching(self, flt: Filter | None) -> int:
        """How many chunks pass `flt` (all of them for None)."""
        ...

    @property
    def source(self) -> str:
        """What it was published as: its folder's name (a folder version) or its Qdrant collection;
        a hot-reload watch compares it with what is published now."""
        ...

    @property
    def lexical_available(self) -> bool:
        """Whether it keeps a lexical (BM25) index over the same chunks (False for a version built
        before BM25 was added: hybrid then falls back to dense)."""
        ...

    def search_lexical(self, query: str, k: int, flt: Filter | None = None) -> list[ScoredChunk]:
        """The k best chunks by BM25 score among those passing `flt` (only chunks sharing a term
        with the query)."""
        ...

    def chunks_in_order(self, limit: int) -> Sequence[Chunk]:
        """The first `limit` chunks in the index's own order (warming fills the KV cache with them
        after the most retrieved); where the index can, each is decoded when it is read."""
        ...

    def chunks_by_id(self, chunk_ids: Sequence[str], flt: Filter | None = None) -> list[Chunk]:
        """The chunks with these ids that this version holds and that pass `flt`, in the order
        asked; others skipped (to pre-fill the engine's KV with known passages; a caller's fetch).
        `flt` is checked before a chunk is read, so one that fails it costs what an unknown id does."""
        ...
