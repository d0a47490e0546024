"""Cache keys: the normalized query plus everything else that changes the passage list.

What goes into a key: the query (NFKC, whitespace collapsed, case kept: a cased embedder would
give a different vector), top_k, the index version and identity (a newly published version makes
every older entry unreachable; the identity, a hash of what the version holds, keeps apart two
corpora, or a rebuilt root, or two backends that happen to share a version number), the model
ids (embedder, and reranker tiers where configured) and the server settings that change the
ranking (e.g. HNSW ef). The budget is NOT in the key: it changes how much
work may be done, not what the answer is; a result cut short by the budget is never stored.

An answer key is a retrieval key's parts plus what turns passages into text: the generator model,
the prompt template, the context token budget, max_tokens and the conversation turns the prompt
quotes (a retrieval key already holds the user turns retrieval searched with). It has its own prefix ("a" against
"r"), so an answer and a passage list can never be read for each other.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass
from typing import ClassVar

import orjson

KEY_SCHEMA = 2  # bump when the key layout or the entry encoding changes


def normalize_query(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass(frozen=True, slots=True)
class _CacheKey:
    query: str
    scope: str
    index_version: str
    top_k: int = 0  # also in `scope`; kept readable to bound a stored entry (0: unknown)

    _prefix: ClassVar[str] = ""

    @property
    def storage_key(self) -> str:
        return _storage_key(self._prefix, self)


@dataclass(frozen=True, slots=True)
class RetrievalKey(_CacheKey):
    """`scope` is every key part except the query: entries of one scope are interchangeable."""

    _prefix: ClassVar[str] = "r"


@dataclass(frozen=True, slots=True)
class AnswerKey(_CacheKey):
    """The same layout as a retrieval key; `scope` also covers the generation settings."""

    _prefix: ClassVar[str] = "a"


def _storage_key(prefix: str, key: _CacheKey) -> str:
    # The index version stays readable in the key (operators can see which version an entry is for).
    digest = hashlib.blake2b(key.query.encode(), digest_size=16).hexdigest()
    return f"{prefix}{KEY_SCHEMA}:{key.index_version}:{key.scope}:{digest}"


def _scope(*parts: object) -> str:
    return hashlib.blake2b(orjson.dumps([KEY_SCHEMA, *parts]), digest_size=8).hexdigest()


def retrieval_key(
    query: str,
    top_k: int,
    index_version: str,
    model_ids: tuple[str, ...],
    settings: tuple[str, ...] = (),
    index_identity: str = "",
    request: list[object] | None = None,
) -> RetrievalKey:
    """`index_identity` is the index's SearchIndex.identity; it enters the scope (and so the storage
    key, the semantic guard and every answer key built on this one). `request`: the request's
    other fields as JSON-able values (its filter and the caller's grant among them)."""
    scope = _scope(top_k, index_version, index_identity, list(model_ids), list(settings), request or [])
    return RetrievalKey(normalize_query(query), scope, index_version, top_k)


def answer_key(
    retrieval: RetrievalKey,
    generator_model: str,
    prompt_template: str,
    context_token_budget: int,
    max_tokens: int,
    history: list[list[str]] | None = None,
) -> AnswerKey:
    """`retrieval` is the key of the passage list the answer was generated from (its index version
    must be the one the retrieval used, which may have come from the retrieval cache). `history`:
    the conversation's turns the prompt quotes, as [role, text] pairs (none: a question alone)."""
    parts: list[object] = [retrieval.scope, generator_model, prompt_template, context_token_budget, max_tokens]
    if history:  # absent, the key is the one a question alone always had
        parts.append(history)
    scope = _scope(*parts)
    return AnswerKey(retrieval.query, scope, retrieval.index_version, retrieval.top_k)
