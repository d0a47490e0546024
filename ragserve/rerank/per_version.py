"""Which reranker serves each index version: the configured tiers for all of them, or the tuned
cross-encoder a version ships (RAGSERVE_RERANK_MODE auto / tuned).

The choice is made once, when the version is loaded (the factory's `VersionBuilder`), and the
reranker travels with the version (`ServingVersion`): a request that read one version keeps its
reranker for its whole life, and a reload never mixes one version's candidates with another's model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ragserve.rerank.base import Reranker, TunedCrossEncoder

log = logging.getLogger(__name__)


class SameReranker:
    """The configured tiers (or none) for every version; a version's tuned model is ignored."""

    def __init__(self, reranker: Reranker | None) -> None:
        self.reranker = reranker

    def for_version(self, version: str, tuned: TunedCrossEncoder | None) -> Reranker | None:
        return self.reranker  # warm_up measures once: a later version finds the costs in place

    def cache_tags(self) -> tuple[str, ...]:
        return tuple(self.reranker.describe()) if self.reranker is not None else ()


class VersionRerankers:
    """Each version's own tuned cross-encoder, built by `build`; with `require_beats_fused` (auto)
    only when its blend beat the fused order on the tuner's held-back queries. A version without
    one is served in fused order."""

    def __init__(self, build: Callable[[TunedCrossEncoder], Reranker], *, require_beats_fused: bool, tag: str) -> None:
        self._build = build
        self._require_beats_fused = require_beats_fused
        self._mode = "auto" if require_beats_fused else "tuned"
        self._tag = tag

    def cache_tags(self) -> tuple[str, ...]:
        # The model itself is the version's: the index identity in every cache key covers it.
        return (self._tag,)

    def for_version(self, version: str, tuned: TunedCrossEncoder | None) -> Reranker | None:
        setting = f"RAGSERVE_RERANK_MODE={self._mode}"
        if tuned is None:
            if self._require_beats_fused:
                log.info("index version %s ships no tuned cross-encoder: fused order (%s)", version, setting)
            else:
                log.warning("%s but index version %s ships no tuned cross-encoder: fused order", setting, version)
            return None
        if self._require_beats_fused and not tuned.beats_fused:
            log.info(
                "index version %s ships tuned cross-encoder %s, which did not beat the fused order when tuned: "
                "fused order (%s; RAGSERVE_RERANK_MODE=tuned would use it)",
                version,
                tuned.model_id,
                setting,
            )
            return None
        verdict = "it beat the fused order when tuned" if tuned.beats_fused else "it did NOT beat the fused order"
        log.info(
            "index version %s is reranked by its tuned cross-encoder %s, ce_weight %g (%s; %s)",
            version,
            tuned.model_id,
            tuned.ce_weight,
            verdict,
            setting,
        )
        return self._build(tuned)
