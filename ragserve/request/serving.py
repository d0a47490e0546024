"""What one index version serves with, as one value, and the source the pipeline reads it from.

A version may ship its own tuned query embedder, tuned cross-encoder and fitted fusion weight
(`ragserve-index tune`, `ragserve-index tune-reranker`); the factory loads those beside the index
files and builds this value (ragserve/factory/versions.py `VersionBuilder`). A request reads it
once, so a hot reload never mixes one version's candidates with another version's models.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ragserve import metrics
from ragserve.embed.base import Embedder
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions
from ragserve.rerank.base import Reranker, RerankerSource


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


class VersionSource:
    """The version being served, and how the next one is built (`build`: the factory's
    VersionBuilder, which loads what a version ships; by default `configured_versions`)."""

    def __init__(self, index: SearchIndex, build: Callable[[SearchIndex], ServingVersion]) -> None:
        self._build = build
        self.current = build(index)
        self.served_since = time.time()
        metrics.INDEX_SERVED_SINCE.set(self.served_since)
        self.last_refusal = ""  # why the last newly published version was refused ("" none yet)
        self.last_refusal_at = 0.0

    def swap(self, index: SearchIndex) -> None:
        """From the next request on (one assignment, atomic under the GIL); calls in flight keep the
        version they read, with its models. Blocking (the reloader calls it on its own thread): the
        models the version ships are loaded and its reranker warmed first, so no request pays for
        them; raises a RagError when the version cannot be served."""
        serving = self._build(index)
        serving.warm_up()
        self.current = serving
        self.served_since = time.time()
        metrics.INDEX_SERVED_SINCE.set(self.served_since)

    def refused(self, reason: str) -> None:
        """A newly published version was refused: the current one keeps serving (Info says why)."""
        self.last_refusal, self.last_refusal_at = reason, time.time()
        metrics.INDEX_RELOADS_REFUSED.inc()
        metrics.INDEX_LAST_REFUSAL.set(self.last_refusal_at)


def configured_versions(
    embedder: Embedder, rerankers: RerankerSource | None, options: RetrievalOptions
) -> Callable[[SearchIndex], ServingVersion]:
    """Every version with the configured embedder, reranker and options (nothing it ships is loaded)."""

    def serving(index: SearchIndex) -> ServingVersion:
        reranker = rerankers.for_version(index.version, None) if rerankers is not None else None
        return ServingVersion(index, embedder, reranker, options)

    return serving
