"""Semantic reuse (off by default): a near-duplicate query may reuse a recent query's entry.

Near-duplicate = cosine of the two query embeddings at or above a threshold, among this process's
recent queries of the same scope (same top_k, index version, models). Cosine alone is not enough:
"X increases Y" and "X does not increase Y" embed almost identically. So a guard of plain, explainable
rules must also find no change in meaning. It compares:

- negation: the number of negation words (not, no, never, without, ...n't);
- numbers: every number with the word that follows it ("5 mg" vs "50 mg", "5 mg" vs "5 g");
- named entities: capitalized, all-caps or alphanumeric tokens (TCP, Lucene, COVID-19) must appear
  in the other query too;
- direction: words of opposite polarity (increase/decrease, before/after, maximum/minimum, ...).

Any difference is a miss. The guard errs on the side of a miss: a miss only costs time.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ragserve.cache.keys import RetrievalKey
from ragserve.config import CacheSettings, default_of

_TOKEN = re.compile(r"[0-9]+(?:[.,][0-9]+)*|%|\w+(?:'\w+)*")
_NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor", "without", "cannot", "nope"}
)
_NUMBER_WORDS = {
    w: float(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
} | {"thirty": 30.0, "forty": 40.0, "fifty": 50.0, "hundred": 100.0, "thousand": 1e3, "million": 1e6, "billion": 1e9}
_UNIT_ALIASES = {"%": "percent", "pct": "percent"}
# Words that commonly start a question or instruction: capitalized there, yet not a name.
_STARTERS = frozenset(
    [
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "can",
        "could",
        "should",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "has",
        "have",
        "had",
        "the",
        "a",
        "an",
        "in",
        "on",
        "at",
        "of",
        "for",
        "to",
        "by",
        "from",
        "with",
        "explain",
        "describe",
        "define",
        "list",
        "give",
        "tell",
        "show",
        "compare",
        "name",
        "please",
        "summarize",
        "summarise",
        "find",
        "i",
        "we",
        "you",
        "it",
        "this",
        "that",
        "these",
        "those",
        "there",
        "if",
        "whether",
    ]
)
# Groups of opposite polarity. A word of 5+ letters also matches as a prefix (increas -> increases,
# increasing); shorter ones only exactly, so "pro" does not match "protocol".
_POLARITY = (
    (
        (
            "increas",
            "raise",
            "raises",
            "raised",
            "raising",
            "rise",
            "rises",
            "rising",
            "rose",
            "higher",
            "more",
            "greater",
            "larger",
            "bigger",
            "faster",
            "above",
            "boost",
            "enhanc",
            "promot",
            "gain",
            "gains",
            "grow",
            "grows",
            "growing",
            "growth",
            "up",
        ),
        (
            "decreas",
            "reduc",
            "lower",
            "less",
            "fewer",
            "smaller",
            "slower",
            "below",
            "declin",
            "drop",
            "drops",
            "dropped",
            "inhibit",
            "suppress",
            "loss",
            "lose",
            "loses",
            "losing",
            "shrink",
            "down",
        ),
    ),
    (("before", "prior", "earlier", "precede"), ("after", "later", "follow")),
    (("max", "maxim", "most", "best", "upper"), ("min", "minim", "least", "worst")),
    (("positive", "benefit", "advantage", "pros"), ("negative", "harm", "harms", "harmful", "disadvantage", "cons")),
    (("true", "correct", "valid"), ("false", "incorrect", "invalid", "wrong")),
    (("enable", "allow", "permit", "accept"), ("disable", "forbid", "prohibit", "reject", "deny", "denies")),
)


def _polarity_table() -> tuple[dict[str, list[tuple[int, int]]], tuple[int, ...]]:
    # word -> [(group, side)]; prefixes are looked up by the token's first n letters, so the cost per
    # token is a few dict lookups instead of a scan over every word of every group.
    table: dict[str, list[tuple[int, int]]] = {}
    for group, sides in enumerate(_POLARITY):
        for side, words in enumerate(sides):
            for word in words:
                table.setdefault(word, []).append((group, side))
    prefix_lengths = tuple(sorted({len(w) for w in table if len(w) >= 5}))
    return table, prefix_lengths


_POLARITY_WORDS, _PREFIX_LENGTHS = _polarity_table()


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.replace("\u2019", "'"))


def _negations(tokens: list[str]) -> int:
    return sum(1 for t in tokens if t.lower() in _NEGATIONS or t.lower().endswith("n't"))


def _number(token: str) -> float | None:
    low = token.lower()
    if low in _NUMBER_WORDS:
        return _NUMBER_WORDS[low]
    if low[:1].isdigit():
        try:
            return float(low.replace(",", ""))
        except ValueError:
            return None
    return None


def _quantities(tokens: list[str]) -> Counter[tuple[float, str]]:
    found: Counter[tuple[float, str]] = Counter()
    for i, token in enumerate(tokens):
        value = _number(token)
        if value is None:
            continue
        nxt = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
        if _number(nxt) is not None:
            nxt = ""
        found[(value, _UNIT_ALIASES.get(nxt, nxt))] += 1
    return found


def _strip_possessive(token: str) -> str:
    return token[:-2] if token.lower().endswith("'s") else token


def _entities(text: str) -> set[str]:
    entities: set[str] = set()
    for sentence in re.split(r"(?<=[.?!;:])\s+", text.strip()):
        for i, raw in enumerate(_tokens(sentence)):
            token = _strip_possessive(raw)
            if not token or not any(c.isalpha() for c in token):
                continue
            has_digit = any(c.isdigit() for c in token)
            inner_upper = any(c.isupper() for c in token[1:])
            capitalized = token[0].isupper()
            if has_digit or inner_upper or (capitalized and (i > 0 or token.lower() not in _STARTERS)):
                entities.add(token.casefold())
    return entities


def _polarity(tokens: list[str]) -> frozenset[tuple[int, int]]:
    """The (group, side) pairs present: a word of 5+ letters also matches as a prefix."""
    found: set[tuple[int, int]] = set()
    for token in tokens:
        low = token.lower()
        found.update(_POLARITY_WORDS.get(low, ()))
        for n in _PREFIX_LENGTHS:
            if len(low) > n:
                found.update(_POLARITY_WORDS.get(low[:n], ()))
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class _Features:
    negations: int
    quantities: Counter[tuple[float, str]]
    entities: frozenset[str]
    folded: frozenset[str]
    polarity: frozenset[tuple[int, int]]


@lru_cache(maxsize=4096)
def _features(text: str) -> _Features:
    # Memoized: a stored query is compared again and again, and its features never change.
    tokens = _tokens(text)
    return _Features(
        _negations(tokens),
        _quantities(tokens),
        frozenset(_entities(text)),
        frozenset(_strip_possessive(t).casefold() for t in tokens),
        _polarity(tokens),
    )


def meaning_change(a: str, b: str) -> str:
    """Why `a` and `b` may mean different things ("" when the guard finds no change)."""
    fa, fb = _features(a), _features(b)
    if fa.negations != fb.negations:
        return "negation"
    if fa.quantities != fb.quantities:
        return "numbers"
    if not fa.entities <= fb.folded or not fb.entities <= fa.folded:
        return "entities"
    if fa.polarity != fb.polarity:
        return "direction"
    return ""


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
