"""Settings -> a wired RagPipeline: the parts (factory/parts.py), the versions it serves
(factory/versions.py), the model threads, the caches' scope and the policy."""

from __future__ import annotations

import logging
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from ragserve.cache.base import AnswerCache, RetrievalCache
from ragserve.config import (
    LimitsSettings,
    QdrantSettings,
    ReaderSettings,
    RetrievalSettings,
    Settings,
    default_home,
    default_of,
)
from ragserve.embed.base import Embedder
from ragserve.factory.parts import (
    make_answer_cache,
    make_cache,
    make_embedder,
    make_generator,
    make_index,
    make_reader,
    make_rerankers,
    make_retrieval_first,
    make_retrieval_options,
)
from ragserve.factory.versions import VersionBuilder
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions
from ragserve.read.base import Reader
from ragserve.request.caches import PipelineCaches, cache_scope
from ragserve.request.decline import Decline, DeclineModel
from ragserve.request.hot import HotPassages
from ragserve.request.model_threads import ClassedExecutor, ModelThreads
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import AnswerPolicy
from ragserve.request.reading import ReadingStage
from ragserve.request.search import SearchStage
from ragserve.request.serving import VersionSource, configured_versions
from ragserve.rerank.base import RerankerSource
from ragserve.retrieval_first import RetrievalFirst

log = logging.getLogger(__name__)


def hot_passages_path(settings: Settings) -> Path:
    """Where the retrieval counts persist: the setting, else beside the index it counts."""
    if settings.warming.hot_passages_path is not None:
        return settings.warming.hot_passages_path
    if settings.index.backend == "qdrant":
        return default_home() / f"hot-passages-{settings.qdrant.collection}.json"
    return settings.index.path / "hot-passages.json"


def answer_policy(settings: Settings) -> AnswerPolicy:
    answer, warming = settings.answer, settings.warming
    return AnswerPolicy(
        answer.prompt_layout,
        answer.prompt_whole_passage_max_tokens,
        answer.low_support_below,
        answer.abstain_on_low_support,
        warming.warm_passages,
        warming.warm_kv_share,
        warming.warm_whole_corpus,
        reader_lead=settings.reader.enabled and settings.reader.lead,
        decline=make_decline(settings),
    )


def make_decline(settings: Settings) -> Decline | None:
    """The shipped decline model at the configured false rate; off for an embedder whose cosines
    it was not fitted on."""
    model = DeclineModel.load()
    if model.embedder and model.embedder != settings.embedder.model:
        log.warning("the decline is off: fitted on %s's cosines, serving %s", model.embedder, settings.embedder.model)
        return None
    return Decline.at(model, settings.answer.decline_false_rate)


def make_pipeline(settings: Settings, with_generator: bool = True) -> RagPipeline:
    """Load and wire every part; the generator is started separately (it is async)."""
    embedder = make_embedder(settings.embedder)
    index = make_index(settings)
    log.info("index version %s loaded: %d chunks from %s", index.version, index.count, settings.index.path)
    rerankers = make_rerankers(settings)
    options = make_retrieval_options(settings)
    first = make_retrieval_first(settings)
    generator = make_generator(settings, first) if with_generator else None
    # Model threads run interactive requests' calls before batch ones (request/model_threads.py).
    executor = ClassedExecutor(settings.limits.model_threads, "ragserve-model")
    rerank_executor = None
    # auto and tuned may need it for a version loaded later; its threads start only when used.
    if settings.rerank.mode != "off":
        rerank_executor = ClassedExecutor(settings.rerank.concurrency, "ragserve-rerank")
    search_executor = None
    if settings.index.backend == "qdrant":
        # Network searches on their own threads: a slow Qdrant never queues the next embedding.
        search_executor = ThreadPoolExecutor(
            max_workers=settings.qdrant.search_threads, thread_name_prefix="ragserve-qdrant"
        )
    return assemble_pipeline(
        embedder,
        index,
        generator,
        executor,
        ef_search=settings.retrieval.hnsw_ef_search,
        cache=make_cache(settings),
        retrieval=options,
        rerankers=rerankers,
        policy=answer_policy(settings),
        hot=HotPassages(hot_passages_path(settings)),
        reader=make_reader(settings.reader),
        reading=settings.reader,
        batch_engine_seqs=settings.limits.batch_max_engine_seqs,
        rerank_executor=rerank_executor,
        answers=make_answer_cache(settings) if generator is not None else None,
        search_executor=search_executor,
        search_min_ms=settings.qdrant.min_search_ms,
        versions=VersionBuilder.from_settings(settings, embedder, rerankers, options),
        retrieval_first=first,
    )


def assemble_pipeline(
    embedder: Embedder,
    index: SearchIndex,
    generator: Generator | None,
    executor: Executor,
    *,
    ef_search: int = default_of(RetrievalSettings, "hnsw_ef_search"),
    cache: RetrievalCache | None = None,
    retrieval: RetrievalOptions | None = None,
    rerankers: RerankerSource | None = None,
    policy: AnswerPolicy | None = None,
    rerank_executor: Executor | None = None,
    answers: AnswerCache | None = None,
    search_executor: Executor | None = None,
    search_min_ms: float = default_of(QdrantSettings, "min_search_ms"),
    versions: VersionBuilder | None = None,
    hot: HotPassages | None = None,
    reader: Reader | None = None,
    reading: ReaderSettings | None = None,
    batch_engine_seqs: int = default_of(LimitsSettings, "batch_max_engine_seqs"),
    retrieval_first: RetrievalFirst | None = None,
) -> RagPipeline:
    """A pipeline from parts already made (make_pipeline's, or a test's). `rerankers`: how each
    version's reranker is chosen (None: none ever is). `versions`: what a version serves with (the
    models it ships); by default the configured embedder and reranker, whatever it ships.
    `retrieval_first`: the gate `generator` waits at while an interactive retrieval runs."""
    options = retrieval or RetrievalOptions()
    build = versions or configured_versions(embedder, rerankers, options)
    threads = ModelThreads(executor, rerank_executor, search_executor, retrieval_first)
    search = SearchStage(options, ef_search, rerankers, threads, search_min_ms)
    policy = policy or AnswerPolicy()
    scope = cache_scope(embedder.model_id, search, generator, policy.prompt_id)
    return RagPipeline(
        VersionSource(index, build),
        search,
        generator,
        PipelineCaches(scope, cache, answers),
        policy,
        hot or HotPassages(None),
        reading_stage(reader, threads, reading or ReaderSettings(), generator) if reader is not None else None,
        batch_engine_seqs,
    )


def reading_stage(
    reader: Reader, threads: ModelThreads, settings: ReaderSettings, generator: Generator | None
) -> ReadingStage:
    """The reader on the request path. "auto" starts a Query's reader beside the prefill only when
    the generator runs elsewhere: on this host the two would share its cores."""
    elsewhere = generator is not None and not generator.status().on_this_host
    return ReadingStage(
        reader,
        threads,
        settings.max_passages,
        settings.budget_ms,
        settings.threshold,
        settings.abstain,
        beside_prefill=settings.start == "prefill" or (settings.start == "auto" and elsewhere),
        highlight=settings.highlight,
    )
