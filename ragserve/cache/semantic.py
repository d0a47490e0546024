"""Semantic reuse (off by default): a near-duplicate query may reuse a recent query's entry.

Near-duplicate = cosine of the two query embeddings at or above a threshold, among this process's
recent queries of the same scope (same top_k, index version, models), and no change in meaning
found by the guard (cache/meaning.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ragserve.cache.keys import RetrievalKey
from ragserve.cache.meaning import meaning_change
from ragserve.config import CacheSettings, default_of


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    key: RetrievalKey | None  # the entry to reuse, or None
    similarity: float  # best cosine seen at or above the threshold (0 when none)
    rejected: str  # why the best near-duplicate was refused ("" if none was)
    examined: int = 0  # near-duplicates the guard compared (at most `max_candidates`)


class SemanticIndex:
    """The last `window` stored queries and their embeddings, in process memory.

    With Redis the entries are shared, but each sidecar only knows its own recent queries.
    Embeddings are L2-normalized, so a dot product is the cosine.

    A lookup compares at most `max_candidates` near-duplicates with the guard, best first: a flood
    of crafted variants of one question cannot make a lookup cost more than that. Lookups may run
    on a worker thread while the event loop adds entries: a lock guards the arrays, and the guard
    (the slow part) runs outside it. Callers add and look up only queries that fit the embedder's
    token window (a cut query's vector stands for its prefix alone).
    """

    def __init__(
        self,
        threshold: float = default_of(CacheSettings, "semantic_threshold"),
        window: int = default_of(CacheSettings, "semantic_window"),
        max_candidates: int = default_of(CacheSettings, "semantic_max_candidates"),
    ) -> None:
        if not 0.0 < threshold <= 1.0 or window < 1 or max_candidates < 1:
            raise ValueError("threshold must be in (0, 1], window >= 1 and max_candidates >= 1")
        self.threshold = threshold
        self.window = window
        self.max_candidates = max_candidates
        self._lock = threading.Lock()
        self._vectors: np.ndarray | None = None
        self._keys: list[RetrievalKey | None] = [None] * window
        self._slot_of: dict[str, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._slot_of)

    def add(self, key: RetrievalKey, vector: np.ndarray) -> None:
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        with self._lock:
            if self._vectors is None or self._vectors.shape[1] != vec.shape[0]:
                self._reset()
                self._vectors = np.zeros((self.window, vec.shape[0]), dtype=np.float32)
            slot = self._slot_of.get(key.storage_key)
            if slot is None:
                slot = self._next
                self._next = (self._next + 1) % self.window
                old = self._keys[slot]
                if old is not None:
                    self._slot_of.pop(old.storage_key, None)
                self._slot_of[key.storage_key] = slot
            self._keys[slot] = key
            self._vectors[slot] = vec

    def _candidates(self, key: RetrievalKey, vec: np.ndarray) -> list[tuple[RetrievalKey, float]]:
        """The best `max_candidates` near-duplicates of the same scope, best first (vectorized)."""
        with self._lock:
            if self._vectors is None or not self._slot_of or vec.shape[0] != self._vectors.shape[1]:
                return []
            sims = self._vectors @ vec
            above = np.flatnonzero(sims >= self.threshold)
            found: list[tuple[RetrievalKey, float]] = []
            for slot in above[np.argsort(-sims[above], kind="stable")]:
                other = self._keys[int(slot)]
                if other is None or other.scope != key.scope or other.index_version != key.index_version:
                    continue
                if other.query == key.query:
                    continue  # the exact lookup already missed it
                found.append((other, float(sims[slot])))
                if len(found) >= self.max_candidates:
                    break
            return found

    def lookup(self, key: RetrievalKey, vector: np.ndarray) -> SemanticMatch:
        candidates = self._candidates(key, np.asarray(vector, dtype=np.float32).reshape(-1))
        best_sim, rejected = 0.0, ""
        for examined, (other, sim) in enumerate(candidates, start=1):
            reason = meaning_change(key.query, other.query)
            if not reason:
                return SemanticMatch(other, sim, "", examined)
            if not rejected:
                best_sim, rejected = sim, reason
        return SemanticMatch(None, best_sim, rejected, len(candidates))

    def clear(self) -> None:
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        self._vectors = None
        self._keys = [None] * self.window
        self._slot_of.clear()
        self._next = 0
