"""A passage's sentences as the request path weighs them (request/sentences.py works them out; the
indexer stores them with each chunk, ragserve/index/chunk_store.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PassageSentences:
    """(start, end) offsets of each sentence in the passage's text, and each one's stemmed content terms."""

    spans: tuple[tuple[int, int], ...]
    terms: tuple[frozenset[str], ...]
