"""Cache keys: the normalized query plus everything else that changes the passage list.

What goes into a key: the query (NFKC, whitespace collapsed, case kept: a cased embedder would
give a different vector), top_k, the index version (a newly published version makes every older
entry unreachable), the model ids (embedder, and reranker tiers where configured) and the server
settings that change the ranking (e.g. HNSW ef). The budget is NOT in the key: it changes how much
work may be done, not what the answer is; a result cut short by the budget is never stored.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass

import orjson

KEY_SCHEMA = 1  # bump when the key layout or the entry encoding changes


def normalize_query(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass(frozen=True, slots=True)
class RetrievalKey:
    """`scope` is every key part except the query: entries of one scope are interchangeable."""

    query: str
    scope: str
    index_version: str

    @property
    def storage_key(self) -> str:
        digest = hashlib.blake2b(self.query.encode(), digest_size=16).hexdigest()
        return f"r{KEY_SCHEMA}:{self.index_version}:{self.scope}:{digest}"


def retrieval_key(
    query: str,
    top_k: int,
    index_version: str,
    model_ids: tuple[str, ...],
    settings: tuple[str, ...] = (),
) -> RetrievalKey:
    parts = orjson.dumps([KEY_SCHEMA, top_k, index_version, list(model_ids), list(settings)])
    scope = hashlib.blake2b(parts, digest_size=8).hexdigest()
    return RetrievalKey(normalize_query(query), scope, index_version)
