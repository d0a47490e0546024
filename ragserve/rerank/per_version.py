"""Which reranker serves each index version: the configured tiers for all of them, or the tuned
cross-encoder a version ships (RAGSERVE_RERANK_MODE auto / tuned).

A version's reranker is built and warmed up (its cost measured) by `prepare`, at start-up and in
`swap_index` before the version serves, so no request pays for it. A request reads its index once
and asks `for_index` for that version's reranker: a reload never mixes one version's candidates
with another's model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ragserve.index.base import SearchIndex
from ragserve.rerank.base import Reranker
from ragserve.rerank.tuned import TunedCrossEncoder

log = logging.getLogger(__name__)


class SameReranker:
    """The configured tiers (or none) for every version; a version's tuned model is ignored."""

    def __init__(self, reranker: Reranker | None) -> None:
        self.reranker = reranker

    def for_index(self, index: SearchIndex) -> Reranker | None:
        return self.reranker

    def prepare(self, index: SearchIndex) -> None:
        if self.reranker is not None:
            self.reranker.warm_up()  # measures once; later calls find the costs in place

    def cache_tags(self) -> tuple[str, ...]:
        return tuple(self.reranker.describe()) if self.reranker is not None else ()


class VersionRerankers:
    """Each version's own tuned cross-encoder, built by `build`; with `require_beats_fused` (auto)
    only when its blend beat the fused order on the tuner's held-back queries. Keeps the rerankers
    of the last `keep` versions prepared (the serving one and the one before, for requests still in
    flight on it); a version without one, or older than those, is served in fused order."""

    def __init__(
        self,
        build: Callable[[TunedCrossEncoder], Reranker],
        *,
        require_beats_fused: bool,
        tag: str,
        keep: int = 2,
    ) -> None:
        self._build = build
        self._require_beats_fused = require_beats_fused
        self._mode = "auto" if require_beats_fused else "tuned"
        self._tag = tag
        self._keep = max(1, keep)
        self._lock = threading.Lock()  # prepares come from start-up and the reloader's thread
        # identity -> reranker (None: fused order), oldest first; replaced whole, so a request's
        # lookup never sees it half-changed.
        self._prepared: dict[str, Reranker | None] = {}

    def for_index(self, index: SearchIndex) -> Reranker | None:
        return self._prepared.get(index.identity)

    def prepare(self, index: SearchIndex) -> None:
        with self._lock:
            if index.identity in self._prepared:
                reranker = self._prepared[index.identity]
            else:
                reranker = self._choose(index)
                if reranker is not None:
                    reranker.warm_up()
            others = [(k, v) for k, v in self._prepared.items() if k != index.identity]
            kept = others[max(0, len(others) - (self._keep - 1)) :]
            self._prepared = {**dict(kept), index.identity: reranker}

    def cache_tags(self) -> tuple[str, ...]:
        # The model itself is the version's: the index identity in every cache key covers it.
        return (self._tag,)

    def _choose(self, index: SearchIndex) -> Reranker | None:
        tuned = getattr(index, "tuned_reranker", None)  # a Qdrant-backed version never ships one
        setting = f"RAGSERVE_RERANK_MODE={self._mode}"
        if not isinstance(tuned, TunedCrossEncoder):
            if self._require_beats_fused:
                log.info("index version %s ships no tuned cross-encoder: fused order (%s)", index.version, setting)
            else:
                log.warning("%s but index version %s ships no tuned cross-encoder: fused order", setting, index.version)
            return None
        if self._require_beats_fused and not tuned.beats_fused:
            log.info(
                "index version %s ships tuned cross-encoder %s, which did not beat the fused order when tuned: "
                "fused order (%s; RAGSERVE_RERANK_MODE=tuned would use it)",
                index.version,
                tuned.model_id,
                setting,
            )
            return None
        verdict = "it beat the fused order when tuned" if tuned.beats_fused else "it did NOT beat the fused order"
        log.info(
            "index version %s is reranked by its tuned cross-encoder %s, ce_weight %g (%s; %s)",
            index.version,
            tuned.model_id,
            tuned.ce_weight,
            verdict,
            setting,
        )
        return self._build(tuned)
