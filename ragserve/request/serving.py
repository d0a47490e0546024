"""What one index version serves with, as one value: the pipeline swaps it whole.

A version may ship its own tuned query embedder, tuned cross-encoder and fitted fusion weight
(`indexer tune`, `indexer tune-reranker`); the factory loads those beside the index files and
builds this value (ragserve/factory.py `VersionBuilder`). A request reads it once, so a hot reload
never mixes one version's candidates with another version's models.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragserve.embed.base import Embedder
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions
from ragserve.rerank.base import Reranker


@dataclass(frozen=True, slots=True)
class ServingVersion:
    index: SearchIndex
    # The version's own tuned query embedder, else the configured one.
    embedder: Embedder
    # The configured tiers, the version's tuned cross-encoder (RAGSERVE_RERANK_MODE), or None.
    reranker: Reranker | None
    # The configured options, with the version's fitted dense weight where it applies.
    retrieval: RetrievalOptions

    @property
    def version(self) -> str:
        return self.index.version

    @property
    def identity(self) -> str:
        return self.index.identity

    def warm_up(self) -> None:
        """Measure the reranker's cost (seconds; blocking): before the version serves a request."""
        if self.reranker is not None:
            self.reranker.warm_up()
