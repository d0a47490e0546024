"""The two caches as the request path sees them: keys from one scope, lookups bounded in time.

The pipeline asks "is this passage list (or answer) known?" and "keep this one"; which parts of
the server make up a key (models, ranking settings, template, engine choices) is decided here,
once, at start-up. The caches promise never to raise; should an implementation break that promise,
the request still does not fail: the call is logged and treated as a miss (or a dropped write).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ragserve.cache.base import AnswerCache, CachedAnswer, CachedRetrieval, CacheHit, RetrievalCache
from ragserve.cache.keys import AnswerKey, RetrievalKey, answer_key, retrieval_key
from ragserve.events import FinalSummary, QueryEvent, TokenDelta
from ragserve.filters import Filter, canonical
from ragserve.generate.base import Generator
from ragserve.prompt import is_decline, prompt_template_id
from ragserve.request.answer import AnswerRun
from ragserve.request.context import FittedContext
from ragserve.request.search import SearchStage
from ragserve.types import Degraded, GenerateParams, RetrievalResult, RetrieveParams, StageTimings

T = TypeVar("T")

log = logging.getLogger(__name__)


async def _or_miss(lookup: Awaitable[T | None], what: str) -> T | None:
    try:
        return await lookup
    except Exception:
        log.exception("%s lookup failed; continuing without it", what)
        return None


def _or_drop(write: Callable[[], None], what: str) -> None:
    try:
        write()
    except Exception:
        log.exception("%s write failed; continuing without it", what)


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Everything besides the request and the index that changes a passage list or an answer."""

    embedder_id: str
    # Ranking settings (search breadth, fusion, the reranker's models) as short tags.
    ranking: tuple[str, ...]
    # The retrieval options' own tag takes the request's dedupe flag: (dedupe) -> tag.
    retrieval_tags: tuple[str, str]
    # The answering model, its files' digest and the engine settings that can change a greedy answer.
    generator: str
    prompt_id: str  # AnswerPolicy.prompt_id


def cache_scope(embedder_id: str, search: SearchStage, generator: Generator | None, prompt_id: str) -> CacheScope:
    # The configured tiers, or for a per-version choice the mode and its settings: the model a
    # version ships is that version's, and its identity is in every key already.
    rerank = search.rerankers.cache_tags() if search.rerankers is not None else ()
    generator_tag = ""
    if generator is not None:
        generator_tag = generator.answer_identity
    options = search.options
    return CacheScope(
        embedder_id,
        (f"ef={search.ef_search}", *rerank),
        (options.cache_tag(False), options.cache_tag(True)),
        generator_tag,
        prompt_id,
    )


# RetrieveParams fields outside a key's scope: the budget (how much work may be done, not what
# the answer is) and the query (the key's own part, normalized, so that the semantic cache can
# match across questions of one scope). Every other field enters the scope by itself
# (`request_parts`), so a new field can never share entries with requests that lack it.
NOT_IN_SCOPE = frozenset({"budget_ms", "query"})


def request_parts(params: RetrieveParams) -> list[object]:
    """Every field of the request that changes its passages, as JSON-able values (filters and the
    caller's grant in their canonical form)."""
    parts: list[object] = []
    for item in dataclasses.fields(params):
        if item.name in NOT_IN_SCOPE:
            continue
        value = getattr(params, item.name)
        parts.append([item.name, canonical(value) if isinstance(value, Filter) else value])
    return parts


class PipelineCaches:
    """The retrieval cache and the answer cache (either may be absent) behind one scope."""

    def __init__(self, scope: CacheScope, passages: RetrievalCache | None, answers: AnswerCache | None) -> None:
        self.scope = scope
        self.passages = passages
        self.answers = answers

    def retrieval_key(self, params: RetrieveParams, index_version: str, index_identity: str) -> RetrievalKey:
        tag = self.scope.retrieval_tags[int(params.dedupe_documents)]
        return retrieval_key(
            params.query,
            params.top_k,
            index_version,
            (self.scope.embedder_id,),
            (self.scope.ranking[0], tag, *self.scope.ranking[1:]),
            index_identity,
            request_parts(params),
        )

    def key_for(self, params: RetrieveParams, index_version: str, index_identity: str) -> RetrievalKey | None:
        """This request's key, built once for both caches; None without either (no hashing)."""
        if self.passages is None and self.answers is None:
            return None
        return self.retrieval_key(params, index_version, index_identity)

    async def lookup(self, key: RetrievalKey | None, timeout_s: float | None) -> CacheHit | None:
        if self.passages is None or key is None:
            return None
        return await _or_miss(self.passages.get(key, timeout_s), "retrieval cache")

    def semantic_enabled(self) -> bool:
        return self.passages is not None and self.passages.semantic_enabled

    async def lookup_similar(
        self, key: RetrievalKey | None, vector: np.ndarray, timeout_s: float | None
    ) -> CacheHit | None:
        if self.passages is None or key is None:
            return None
        return await _or_miss(self.passages.get_similar(key, vector, timeout_s), "retrieval cache")

    def store(self, key: RetrievalKey | None, result: RetrievalResult, vector: np.ndarray | None) -> None:
        """`vector`: None when the query must never be matched semantically."""
        if self.passages is None or key is None:
            return
        entry = CachedRetrieval(
            tuple(result.passages),
            result.index_version,
            tuple(result.rerank_tiers),
            key.query,
            result.degraded.is_degraded(),
        )
        passages = self.passages
        _or_drop(lambda: passages.put(key, entry, vector), "retrieval cache")

    def answer_key(self, key: RetrievalKey | None, gen: GenerateParams) -> AnswerKey | None:
        """None when the answer is not to be cached: no answer cache, or not a greedy request (only
        temperature 0 is reproducible). `key`: the request's retrieval key (`key_for`)."""
        if self.answers is None or key is None or gen.temperature != 0.0:
            return None
        return answer_key(
            key,
            self.scope.generator,
            prompt_template_id(self.scope.prompt_id),
            gen.context_token_budget,
            gen.max_tokens,
            [[turn.role, turn.text] for turn in gen.history],  # the prompt quotes them
        )

    async def lookup_answer(self, key: AnswerKey, timeout_s: float | None) -> CachedAnswer | None:
        assert self.answers is not None  # a key exists only with an answer cache
        return await _or_miss(self.answers.get(key, timeout_s), "answer cache")

    def store_answer(
        self, key: AnswerKey, run: AnswerRun, retrieval: RetrievalResult, model_id: str, context: FittedContext
    ) -> None:
        """A clean answer (the pipeline decides what is clean), with the passages it was made from."""
        entry = CachedAnswer(
            run.text,
            tuple(retrieval.passages),
            retrieval.index_version,
            tuple(retrieval.rerank_tiers),
            run.usage,
            model_id,
            context.tokens,
            context.tokens_full,
        )
        answers = self.answers
        assert answers is not None
        _or_drop(lambda: answers.put(key, entry), "answer cache")  # in the background: nobody waits

    async def start(self) -> None:
        for cache in (self.passages, self.answers):
            if cache is not None:
                await cache.start()  # pre-connect the Redis pool before traffic arrives

    async def close(self) -> None:
        for cache in (self.passages, self.answers):
            if cache is not None:
                await cache.close()  # flushes pending background writes


# A hit's text goes out in pieces of at most this many characters (a few events, each small).
_REPLAY_CHUNK_CHARS = 4096


def replay(
    cached: CachedAnswer, timings: StageTimings, elapsed_ms: Callable[[], float], index_identity: str
) -> Iterator[QueryEvent]:
    """An answer-cache hit's events, as a generated answer's: the stored passages, the text, a final
    summary. `timings` are this request's (retrieval so far, answer cache lookup), completed in a
    copy; `elapsed_ms` counts from the request's start (TTFT is taken at the first token event).
    `index_identity`: the index the hit was found under (its key holds it); what is read of the
    replayed passages is kept under it."""
    # The stored passages replace this request's retrieval, so its degraded flags do not apply;
    # only answers from a retrieval that was not cut short are ever stored.
    degraded = Degraded()
    sent = dataclasses.replace(timings)  # the event's own copy, as a generated answer's
    yield RetrievalResult(
        list(cached.passages),
        sent,
        degraded,
        cached.index_version,
        list(cached.rerank_tiers),
        cache_hit=True,
        index_identity=index_identity,
    )
    ttft_ms = elapsed_ms()
    for start in range(0, len(cached.text), _REPLAY_CHUNK_CHARS):
        yield TokenDelta(cached.text[start : start + _REPLAY_CHUNK_CHARS])
    final = dataclasses.replace(timings, ttft_ms=ttft_ms, total_ms=elapsed_ms())
    yield FinalSummary(
        cached.usage,
        final,
        degraded,
        "stop",
        cached.generator_model,
        context_tokens=cached.context_tokens,
        context_tokens_full=cached.context_tokens_full,
        answer_cache_hit=True,
        declined=is_decline(cached.text),
    )
