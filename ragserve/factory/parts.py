"""Settings -> the parts: embedder, index, reranker, caches, generator, index watch. The factory
package is the only place that picks implementations."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ragserve.cache.base import AnswerCache, CacheStore, RetrievalCache
from ragserve.cache.integrity import MIN_KEY_BYTES, EntrySeal
from ragserve.config import CacheSettings, EmbedderSettings, ReaderSettings, RerankSettings, Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import ConfigError
from ragserve.factory.versions import rerank_threads
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.graph import Graph, GraphFile, open_in_process
from ragserve.index.graph_process import GraphProcess
from ragserve.index.hnsw import GraphOpener, HnswIndex
from ragserve.index.reload import FolderWatch, IndexWatch, ServedIndex
from ragserve.read.base import Reader
from ragserve.rerank.base import Reranker, RerankerSource, TunedCrossEncoder
from ragserve.rerank.per_version import SameReranker, VersionRerankers
from ragserve.retrieval_first import RetrievalFirst

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder
    from ragserve.rerank.tiered import TieredReranker

log = logging.getLogger(__name__)


def make_embedder(cfg: EmbedderSettings, *, indexing: bool = False) -> OnnxEmbedder | SentenceTransformerEmbedder:
    """The server's query embedder, or (indexing) the indexer's document embedder: the same choice
    of backend for both. ONNX Runtime's idle threads spin only when indexing (throughput); in the
    server they would steal the cores the reranker and the generator need between queries. The
    indexer runs `cfg.threads` one-thread batches side by side rather than one batch on that many
    threads: more chunks per CPU-second, and a core lent to another process slows one batch, not
    every operator (BENCHMARKS.md, "Indexing throughput at scale")."""
    if cfg.backend == "onnx" and cfg.device == "cpu":
        from ragserve.embed.onnx_backend import OnnxEmbedder

        if indexing and cfg.threads:
            return OnnxEmbedder(cfg.model, quantize=cfg.onnx_int8, threads=1, spin=True, workers=cfg.threads)
        return OnnxEmbedder(cfg.model, quantize=cfg.onnx_int8, threads=cfg.threads, spin=indexing)
    if cfg.backend == "onnx":
        log.info("embedder on %s: using torch (the ONNX backend is the CPU path)", cfg.device)
    return SentenceTransformerEmbedder(cfg.model, device=cfg.device)


def make_index(settings: Settings) -> SearchIndex:
    if settings.index.backend == "qdrant":
        from ragserve.index.qdrant_index import QdrantIndex

        return QdrantIndex.connect(
            settings.qdrant.url,
            settings.qdrant.collection,
            settings.qdrant.api_key or None,
            timeout_s=settings.qdrant.timeout_s,
        )
    return HnswIndex.load(settings.index.path, settings.filters.exact_scan_max_chunks, make_graph_opener(settings))


def make_graph_opener(settings: Settings) -> GraphOpener:
    """A version's HNSW graph: in a helper process from `graph_process_min_chunks` up (its load
    would stall this process's requests), else in this process (a round trip less per search)."""
    threshold = settings.index.graph_process_min_chunks

    def open_graph(file: GraphFile) -> Graph:
        if file.count >= threshold:
            return GraphProcess.open(file)
        return open_in_process(file)

    return open_graph


def make_index_watch(settings: Settings, target: ServedIndex) -> IndexWatch:
    """For hot reload: a folder's CURRENT link, or a Qdrant alias."""
    if settings.index.backend == "qdrant":
        from ragserve.index.qdrant_index import QdrantWatch

        return QdrantWatch(target, settings.qdrant.collection)
    return FolderWatch(settings.index.path, settings.filters.exact_scan_max_chunks, make_graph_opener(settings))


def make_retrieval_options(settings: Settings) -> RetrievalOptions:
    return RetrievalOptions(
        mode=settings.retrieval.retrieval_mode,
        fusion=settings.retrieval.fusion,
        rrf_k=settings.retrieval.rrf_k,
        dense_weight=settings.retrieval.fusion_dense_weight,
        candidates=settings.retrieval.fusion_candidates,
        weight_from_index=settings.retrieval.fusion_weight_from_index,
    )


def make_retrieval_first(settings: Settings) -> RetrievalFirst:
    """The gate an in-process engine waits at (between steps and layers) while an interactive retrieval runs."""
    return RetrievalFirst(settings.generator.yield_to_retrieval_ms / 1000.0)


def make_generator(settings: Settings, retrieval_first: RetrievalFirst | None = None) -> Generator:
    if settings.generator.backend == "remote":
        from ragserve.generate.remote import RemoteVllmGenerator

        # As many connections per server as calls may be in flight: no call waits for a connection.
        return RemoteVllmGenerator(
            settings.generator, settings.limits.max_in_flight, settings.observability.health_probe_timeout_s
        )
    from ragserve.generate.vllm_engine import VllmGenerator

    return VllmGenerator(settings.generator, retrieval_first)


def _cache_settings(settings: Settings | CacheSettings) -> CacheSettings:
    return settings.cache if isinstance(settings, Settings) else settings


def make_cache_store(cfg: CacheSettings) -> CacheStore:
    """One store per cache: each has its own pool (or LRU), breaker and lifetime."""
    from ragserve.cache.memory import MemoryStore

    if cfg.backend == "redis":
        from ragserve.cache.redis_cache import RedisStore

        return RedisStore(
            cfg.redis_url,
            namespace=cfg.namespace,
            timeout_s=cfg.redis_timeout_ms / 1000.0,
            connect_timeout_s=cfg.redis_connect_timeout_ms / 1000.0,
            pool_size=cfg.redis_pool_size,
            health_check_interval_s=cfg.redis_health_check_interval_s,
        )
    return MemoryStore(max_entries=cfg.max_entries, max_bytes=cfg.max_bytes)


def make_entry_seal(cfg: CacheSettings) -> EntrySeal:
    """The size cap and, if a key is configured, the HMAC every cache entry must carry."""
    key: bytes | None = None
    if cfg.hmac_key is not None:
        key = cfg.hmac_key.get_secret_value().encode()
    elif cfg.hmac_key_file is not None:
        try:
            key = cfg.hmac_key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read RAGSERVE_CACHE_HMAC_KEY_FILE={cfg.hmac_key_file}: {exc}") from exc
    if key is not None and len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"the cache HMAC key (RAGSERVE_CACHE_HMAC_KEY*) must be at least {MIN_KEY_BYTES} bytes")
    if key is None and cfg.backend == "redis":
        # Whoever can write to a shared Redis would plant passages and answers every sidecar replays.
        if not cfg.allow_unsigned:
            raise ConfigError(
                "a Redis cache needs a key to sign its entries: set RAGSERVE_CACHE_HMAC_KEY_FILE (or "
                "RAGSERVE_CACHE_HMAC_KEY), the same on every sidecar; RAGSERVE_CACHE_ALLOW_UNSIGNED=true "
                "accepts unsigned entries knowingly"
            )
        log.warning(
            "Redis cache entries are not signed (RAGSERVE_CACHE_ALLOW_UNSIGNED=true): "
            "anyone who can write to Redis can plant answers"
        )
    return EntrySeal(cfg.max_entry_bytes, key)


def make_cache(settings: Settings | CacheSettings) -> RetrievalCache | None:
    """The retrieval cache from RAGSERVE_CACHE_* settings (None when the backend is "off")."""
    from ragserve.cache.circuit import CircuitBreaker
    from ragserve.cache.layer import StoreBackedCache
    from ragserve.cache.semantic import SemanticIndex

    cfg = _cache_settings(settings)
    if cfg.backend == "off":
        return None
    semantic = (
        SemanticIndex(cfg.semantic_threshold, cfg.semantic_window, cfg.semantic_max_candidates)
        if cfg.semantic
        else None
    )
    breaker = CircuitBreaker(cfg.breaker_failures, cfg.breaker_cooldown_s)
    seal = make_entry_seal(cfg)
    log.info(
        "retrieval cache: %s (ttl %.0f s, semantic %s, entries %s)",
        cfg.backend,
        cfg.ttl_s,
        "on" if semantic else "off",
        "authenticated" if seal.authenticated else "not authenticated",
    )
    return StoreBackedCache(
        make_cache_store(cfg),
        ttl_s=cfg.ttl_s,
        degraded_ttl_s=cfg.degraded_ttl_s,
        breaker=breaker,
        semantic=semantic,
        seal=seal,
    )


def make_answer_cache(settings: Settings | CacheSettings) -> AnswerCache | None:
    """The answer cache (None when the backend is "off" or RAGSERVE_CACHE_ANSWERS is false)."""
    from ragserve.cache.circuit import CircuitBreaker
    from ragserve.cache.layer import StoreBackedAnswerCache

    cfg = _cache_settings(settings)
    if cfg.backend == "off" or not cfg.answers:
        return None
    log.info("answer cache: %s (ttl %.0f s, temperature-0 answers only)", cfg.backend, cfg.answer_ttl_s)
    return StoreBackedAnswerCache(
        make_cache_store(cfg),
        ttl_s=cfg.answer_ttl_s,
        breaker=CircuitBreaker(cfg.breaker_failures, cfg.breaker_cooldown_s),
        seal=make_entry_seal(cfg),
    )


def make_reranker(settings: Settings) -> Reranker | None:
    """The configured cross-encoder tiers from RAGSERVE_RERANK_*; None unless the mode is one-tier
    or two-tier (auto and tuned use a version's own model: `make_rerankers`).

    A configured model that cannot be loaded stops start-up with a message naming the model and
    the setting: serving a fused order while claiming a reranker would mislead.
    """
    from ragserve.rerank.cross_encoder import TorchCrossEncoder
    from ragserve.rerank.onnx_cross_encoder import OnnxCrossEncoder
    from ragserve.rerank.tiered import Tier, TieredReranker

    cfg = settings.rerank
    if cfg.mode not in ("one-tier", "two-tier"):
        return None
    threads, cpus = rerank_threads(cfg)
    wanted = [("tier1", cfg.tier1_model, "RAGSERVE_RERANK_TIER1_MODEL", cfg.tier1_max_depth)]
    if cfg.mode == "two-tier":
        wanted.append(("tier2", cfg.tier2_model, "RAGSERVE_RERANK_TIER2_MODEL", cfg.tier2_max_depth))
    tiers = []
    for name, model, setting, depth in wanted:
        if not model.strip():
            raise ConfigError(f"{setting} is empty but RAGSERVE_RERANK_MODE={cfg.mode} needs a model")
        encoder: OnnxCrossEncoder | TorchCrossEncoder
        if cfg.backend == "onnx":
            encoder = OnnxCrossEncoder(
                model, setting, cfg.onnx_cache_dir, cfg.device, cfg.max_seq_len, threads=threads, cpus=cpus
            )
        else:
            encoder = TorchCrossEncoder(model, setting, cfg.device, cfg.max_seq_len, cpus=cpus)
        if encoder.random_head and not cfg.allow_random_heads:
            raise ConfigError(
                f"reranker model {model!r} ({setting}) is an architecture-identical test model with a random "
                "head: its scores are not relevance. Configure a trained cross-encoder, or set "
                "RAGSERVE_RERANK_ALLOW_RANDOM_HEADS=true for latency benchmarks only"
            )
        if encoder.random_head:
            log.warning("%s %s has a RANDOM HEAD (test model): its order is not relevance", name, model)
        tiers.append(Tier(name, encoder, depth, cfg.batch_size))
    log.info("reranker: %s, %s backend, depth policy %s", cfg.mode, cfg.backend, cfg.depth_policy)
    return TieredReranker(
        tiers, cfg.candidates, cfg.depth_policy, reserve_ms=cfg.reserve_ms, max_seq_len=cfg.max_seq_len
    )


def make_tuned_reranker(cfg: RerankSettings, tuned: TunedCrossEncoder) -> TieredReranker:
    """One tier, "tier1", over a version's tuned cross-encoder: RAGSERVE_RERANK_* limits, the
    version's blend weight and sequence length."""
    from ragserve.rerank.tiered import Tier, TieredReranker

    tier = Tier("tier1", tuned.encoder, cfg.tier1_max_depth, cfg.batch_size, ce_weight=tuned.ce_weight)
    return TieredReranker(
        [tier], cfg.candidates, cfg.depth_policy, reserve_ms=cfg.reserve_ms, max_seq_len=tuned.max_seq_len
    )


def make_rerankers(settings: Settings) -> RerankerSource:
    """Which reranker serves each index version: a version's tuned cross-encoder (auto, tuned) or
    the configured tiers (off, one-tier, two-tier)."""
    cfg = settings.rerank
    if cfg.mode in ("auto", "tuned"):
        tag = f"version's tuned cross-encoder ({cfg.mode}) max_depth={cfg.tier1_max_depth}"
        if cfg.depth_policy == "fixed":
            tag += " fixed-depth"
        return VersionRerankers(
            lambda tuned: make_tuned_reranker(cfg, tuned), require_beats_fused=cfg.mode == "auto", tag=tag
        )
    return SameReranker(make_reranker(settings))


def make_reader(settings: ReaderSettings) -> Reader | None:
    """The extractive reader (None: off): the one this project ships, a reader folder, or a
    question-answering model exported to a reader folder once (ragserve/read/export.py)."""
    if not settings.enabled:
        return None
    from ragserve.read.export import reader_folder
    from ragserve.read.onnx_reader import OnnxReader

    folder = reader_folder(settings.model, settings.onnx_cache_dir)
    reader = OnnxReader.from_folder(folder, threads=settings.threads)
    log.info("reader %s: %.1f ms per passage on this host", reader.model_id, reader.cost.ms_per_passage)
    return reader
