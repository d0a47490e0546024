"""Settings -> concrete backends. The only module that picks implementations."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ragserve.cache.base import AnswerCache, CacheStore, RetrievalCache
from ragserve.cache.integrity import MIN_KEY_BYTES, EntrySeal
from ragserve.config import CacheSettings, EmbedderSettings, RerankSettings, Settings, default_home
from ragserve.embed.base import Embedder
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import ConfigError
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexWatch, ServedIndex
from ragserve.request.hot import HotPassages
from ragserve.request.model_threads import ClassedExecutor
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import AnswerPolicy
from ragserve.request.serving import ServingVersion
from ragserve.rerank.base import Reranker, RerankerSource
from ragserve.rerank.per_version import SameReranker, VersionRerankers

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder
    from ragserve.rerank.base import TunedCrossEncoder
    from ragserve.rerank.tiered import TieredReranker

log = logging.getLogger(__name__)


def make_embedder(cfg: EmbedderSettings, *, indexing: bool = False) -> OnnxEmbedder | SentenceTransformerEmbedder:
    """The server's query embedder, or (indexing) the indexer's document embedder: the same choice
    of backend for both. ONNX Runtime's idle threads spin only when indexing (throughput); in the
    server they would steal the cores the reranker and the generator need between queries."""
    if cfg.backend == "onnx" and cfg.device == "cpu":
        from ragserve.embed.onnx_backend import OnnxEmbedder

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
    return HnswIndex.load(settings.index.path)


def make_index_watch(settings: Settings, target: ServedIndex) -> IndexWatch:
    """For hot reload: a folder's CURRENT link, or a Qdrant alias."""
    if settings.index.backend == "qdrant":
        from ragserve.index.qdrant_index import QdrantWatch

        return QdrantWatch(target, settings.qdrant.collection)
    return FolderWatch(settings.index.path)


def make_retrieval_options(settings: Settings) -> RetrievalOptions:
    return RetrievalOptions(
        mode=settings.retrieval.retrieval_mode,
        fusion=settings.retrieval.fusion,
        rrf_k=settings.retrieval.rrf_k,
        dense_weight=settings.retrieval.fusion_dense_weight,
        candidates=settings.retrieval.fusion_candidates,
        weight_from_index=settings.retrieval.fusion_weight_from_index,
    )


def make_generator(settings: Settings) -> Generator:
    if settings.generator.backend == "remote":
        from ragserve.generate.remote import RemoteVllmGenerator

        # As many connections per server as calls may be in flight: no call waits for a connection.
        return RemoteVllmGenerator(
            settings.generator, settings.limits.max_in_flight, settings.observability.health_probe_timeout_s
        )
    from ragserve.generate.vllm_engine import VllmGenerator

    return VllmGenerator(settings.generator)


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


def check_compatible(embedder: Embedder, index: SearchIndex) -> None:
    """An index is only meaningful with the embedder that built it: the version's own tuned one if
    it ships one (checked when that was loaded), else the configured one."""
    if index.embedder_id != embedder.model_id or index.dim != embedder.dim:
        raise ConfigError(
            f"index was built with embedder {index.embedder_id!r} (dim {index.dim}) but the server "
            f"is configured with {embedder.model_id!r} (dim {embedder.dim}); re-index or set RAGSERVE_EMBEDDER_MODEL"
        )


class VersionBuilder:
    """What an index version serves with: the index files, plus the tuned query embedder, tuned
    cross-encoder and fitted fusion weight a folder version may ship (a Qdrant version ships none).
    Blocking: loads ONNX models; the caller warms the reranker before the version serves."""

    def __init__(
        self,
        configured: Embedder,
        rerankers: RerankerSource | None,
        options: RetrievalOptions,
        *,
        embedder_threads: int,
        reranker_threads: int = 0,
        reranker_cpus: frozenset[int] | None = None,
    ) -> None:
        self._configured = configured
        self._rerankers = rerankers
        self._options = options
        self._embedder_threads = embedder_threads
        self._reranker_threads = reranker_threads
        self._reranker_cpus = reranker_cpus

    @classmethod
    def from_settings(
        cls, settings: Settings, configured: Embedder, rerankers: RerankerSource | None, options: RetrievalOptions
    ) -> VersionBuilder:
        threads, cpus = rerank_threads(settings.rerank)
        return cls(
            configured,
            rerankers,
            options,
            embedder_threads=settings.embedder.threads,
            reranker_threads=threads,
            reranker_cpus=cpus,
        )

    def __call__(self, index: SearchIndex) -> ServingVersion:
        from ragserve.index.shipped import fitted_weight
        from ragserve.version_models import load_tuned_embedder, load_tuned_reranker

        embedder: Embedder = self._configured
        tuned_reranker = None
        options = self._options
        if isinstance(index, HnswIndex):
            folder, manifest = index.folder, index.manifest
            embedder = load_tuned_embedder(folder, manifest, self._embedder_threads) or embedder
            tuned_reranker = load_tuned_reranker(folder, manifest, self._reranker_threads, self._reranker_cpus)
            options = options.for_version(fitted_weight(folder, manifest))
        check_compatible(embedder, index)
        if embedder is not self._configured:
            log.info(
                "index version %s ships its own tuned query embedder %s: queries use it",
                index.version,
                index.embedder_id,
            )
        reranker = self._rerankers.for_version(index.version, tuned_reranker) if self._rerankers is not None else None
        return ServingVersion(index, embedder, reranker, options)


def serve_version(index: SearchIndex, configured: Embedder, threads: int = 0) -> ServingVersion:
    """A loaded version with the models it ships, as the server would serve it (no reranker
    chosen): for the indexer's tuners, which verify what they publish this way (threads 0: every core)."""
    builder = VersionBuilder(configured, None, RetrievalOptions(), embedder_threads=threads, reranker_threads=threads)
    return builder(index)


def parse_cpus(spec: str, setting: str) -> frozenset[int] | None:
    """ "0", "0,1" or "0-3" -> a CPU set; empty -> None (no pinning)."""
    if not spec.strip():
        return None
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError as exc:
        raise ConfigError(f"{setting}={spec!r} is not a CPU list like 1 or 0,1 or 0-3") from exc
    return frozenset(cpus)


def rerank_threads(cfg: RerankSettings) -> tuple[int, frozenset[int] | None]:
    """ONNX Runtime threads per reranker call and the CPUs they are pinned to (RAGSERVE_RERANK_*)."""
    cpus = parse_cpus(cfg.cpus, "RAGSERVE_RERANK_CPUS")
    return cfg.threads or (len(cpus) if cpus else 0), cpus


def make_reranker(settings: Settings) -> Reranker | None:
    """The configured cross-encoder tiers from RAGSERVE_RERANK_*; None unless the mode is one-tier
    or two-tier (auto and tuned use a version's own model: `make_rerankers`).

    A configured model that cannot be loaded stops start-up with a message naming the model and
    the setting: serving a fused order while claiming a reranker would mislead.
    """
    from ragserve.rerank.cross_encoder import OnnxCrossEncoder, TorchCrossEncoder
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


def hot_passages_path(settings: Settings) -> Path:
    """Where the retrieval counts persist: the setting, else beside the index it counts."""
    if settings.hot_passages_path is not None:
        return settings.hot_passages_path
    if settings.index.backend == "qdrant":
        return default_home() / f"hot-passages-{settings.qdrant.collection}.json"
    return settings.index.path / "hot-passages.json"


def make_pipeline(settings: Settings, with_generator: bool = True) -> RagPipeline:
    """Load and wire every part; the generator is started separately (it is async)."""
    embedder = make_embedder(settings.embedder)
    index = make_index(settings)
    log.info("index version %s loaded: %d chunks from %s", index.version, index.count, settings.index.path)
    rerankers = make_rerankers(settings)
    options = make_retrieval_options(settings)
    versions = VersionBuilder.from_settings(settings, embedder, rerankers, options)
    generator = make_generator(settings) if with_generator else None
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
    return RagPipeline(
        embedder,
        index,
        generator,
        executor,
        ef_search=settings.retrieval.hnsw_ef_search,
        cache=make_cache(settings),
        retrieval=options,
        rerankers=rerankers,
        policy=AnswerPolicy.from_settings(settings),
        hot=HotPassages(hot_passages_path(settings)),
        batch_engine_seqs=settings.limits.batch_max_engine_seqs,
        rerank_executor=rerank_executor,
        answers=make_answer_cache(settings) if generator is not None else None,
        search_executor=search_executor,
        search_min_ms=settings.qdrant.min_search_ms,
        versions=versions,
    )
