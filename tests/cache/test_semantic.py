"""The semantic layer: near-duplicates reuse an entry only when the guard finds no change in meaning."""

from __future__ import annotations

import numpy as np
import pytest

from ragserve.cache.keys import retrieval_key
from ragserve.cache.meaning import meaning_change
from ragserve.cache.semantic import SemanticIndex
from ragserve.embed.torch_backend import SentenceTransformerEmbedder

THRESHOLD = 0.95

# Pairs that embed as near-duplicates (cosine >= THRESHOLD with MiniLM, checked below) yet mean
# different things: only the guard can tell them apart.
MUST_MISS = [
    ("Aspirin increases bleeding risk", "Aspirin does not increase bleeding risk", "negation"),
    ("Does aspirin increase bleeding risk?", "Does aspirin not increase bleeding risk?", "negation"),
    (
        "What is the recommended dose of 5 mg of melatonin?",
        "What is the recommended dose of 50 mg of melatonin?",
        "numbers",
    ),
    ("Does caffeine raise blood pressure?", "Does caffeine lower blood pressure?", "direction"),
]
# Pairs the guard must also refuse, whatever their cosine.
GUARD_MISS = [
    ("Is a dose of 5 mg safe?", "Is a dose of 50 mg safe?", "numbers"),
    ("Is a dose of 5 mg safe?", "Is a dose of 5 g safe?", "numbers"),
    ("X increases Y", "X does not increase Y", "negation"),
    ("X increases Y", "X doesn't increase Y", "negation"),
    ("Who founded Microsoft?", "Who founded Apple?", "entities"),
    (
        "What are the default generation thresholds of the CPython cyclic garbage collector?",
        "What are the default generation thresholds of the PyPy cyclic garbage collector?",
        "entities",
    ),
    ("What changed in Python 3.11?", "What changed in Python 3.12?", "numbers"),
    ("Side effects before surgery", "Side effects after surgery", "direction"),
]
PARAPHRASES = [
    (
        "What does the TCP three-way handshake exchange between client and server?",
        "What does the TCP three-way handshake exchange between the client and the server?",
    ),
    (
        "What does the TCP three-way handshake exchange between client and server?",
        "what does the tcp three way handshake exchange between client and server",
    ),
    (
        "How many bits per element does a Bloom filter need for a 1 percent false positive rate?",
        "How many bits per element does a Bloom filter need for a 1% false positive rate?",
    ),
    ("Who discovered penicillin?", "Who was the discoverer of penicillin?"),
    (
        "What default values does Apache Lucene use for the BM25 parameters k1 and b?",
        "Which default values does Apache Lucene use for BM25's parameters k1 and b?",
    ),
    ("Explain how a Bloom filter answers membership queries.", "How does a Bloom filter answer membership queries?"),
    ("What causes earthquakes at plate boundaries?", "What causes earthquakes at the boundaries of plates?"),
    ("X does not increase Y", "X doesn't increase Y"),
    ("Is a dose of 5mg safe?", "Is a dose of 5 mg safe?"),
]


@pytest.mark.parametrize(("a", "b", "reason"), MUST_MISS + GUARD_MISS)
def test_guard_finds_the_change_in_meaning(a: str, b: str, reason: str) -> None:
    assert meaning_change(a, b) == reason
    assert meaning_change(b, a) == reason


@pytest.mark.parametrize(("a", "b"), PARAPHRASES)
def test_guard_accepts_paraphrases(a: str, b: str) -> None:
    assert meaning_change(a, b) == ""
    assert meaning_change(b, a) == ""


def _lookup(embedder: SentenceTransformerEmbedder, stored: str, asked: str) -> tuple[bool, float, str]:
    index = SemanticIndex(threshold=THRESHOLD, window=64)
    vectors = embedder.embed_queries([stored, asked, "An unrelated question about volcanoes?"])
    index.add(retrieval_key("An unrelated question about volcanoes?", 3, "1", ("e",)), vectors[2])
    stored_key = retrieval_key(stored, 3, "1", ("e",))
    index.add(stored_key, vectors[0])
    match = index.lookup(retrieval_key(asked, 3, "1", ("e",)), vectors[1])
    if match.key is not None:
        assert match.key == stored_key
    return match.key is not None, float(vectors[0] @ vectors[1]), match.rejected


@pytest.mark.parametrize(("a", "b", "reason"), MUST_MISS)
def test_near_duplicates_that_change_meaning_miss(embedder: SentenceTransformerEmbedder, a, b, reason) -> None:
    hit, cosine, rejected = _lookup(embedder, a, b)
    assert cosine >= THRESHOLD, f"not a near-duplicate any more ({cosine:.3f}): pick another pair"
    assert not hit
    assert rejected == reason


@pytest.mark.parametrize(("a", "b"), [p for p in PARAPHRASES if "X " not in p[0] and "5mg" not in p[0]])
def test_paraphrases_hit(embedder: SentenceTransformerEmbedder, a: str, b: str) -> None:
    hit, cosine, rejected = _lookup(embedder, a, b)
    assert hit, f"cosine {cosine:.3f}, rejected {rejected!r}"


def test_semantic_reuse_stays_within_scope(embedder: SentenceTransformerEmbedder) -> None:
    a, b = PARAPHRASES[0]
    va, vb = embedder.embed_queries([a, b])
    index = SemanticIndex(threshold=THRESHOLD)
    index.add(retrieval_key(a, 3, "1", ("e",)), va)
    assert index.lookup(retrieval_key(b, 5, "1", ("e",)), vb).key is None  # other top_k
    assert index.lookup(retrieval_key(b, 3, "2", ("e",)), vb).key is None  # other index version
    assert index.lookup(retrieval_key(b, 3, "1", ("e",)), vb).key is not None


def test_window_forgets_old_queries() -> None:
    index = SemanticIndex(threshold=0.9, window=2)
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(3, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for i, name in enumerate(["alpha", "beta", "gamma"]):
        index.add(retrieval_key(f"query {name}", 3, "1", ("e",)), vecs[i])
    assert len(index) == 2
    assert index.lookup(retrieval_key("query alpha again", 3, "1", ("e",)), vecs[0]).key is None
    assert index.lookup(retrieval_key("query gamma again", 3, "1", ("e",)), vecs[2]).key is not None
