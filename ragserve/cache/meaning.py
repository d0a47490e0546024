"""The meaning guard of semantic cache reuse: two near-duplicate questions (cosine at or above the
threshold) may still mean different things: "X increases Y" and "X does not increase Y" embed
almost identically. Plain, explainable rules compare:

- negation: the number of negation words (not, no, never, without, ...n't);
- numbers: every number with the word that follows it ("5 mg" vs "50 mg", "5 mg" vs "5 g");
- named entities: capitalized, all-caps or alphanumeric tokens (TCP, Lucene, COVID-19) must appear
  in the other query too;
- direction: words of opposite polarity (increase/decrease, before/after, maximum/minimum, ...).

Any difference is a miss. The guard errs on the side of a miss: a miss only costs time.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

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
