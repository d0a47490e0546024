"""Settings' sections other than the generator's, each reading its own environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragserve.config.base import DEFAULT_EMBEDDER, default_home


class CacheSettings(BaseSettings):
    """Retrieval and answer caches. Environment variables use the RAGSERVE_CACHE_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_CACHE_", extra="forbid", frozen=True)

    # memory: in-process LRU (default); redis: shared by many sidecars; off: no cache.
    backend: Literal["memory", "redis", "off"] = "memory"
    ttl_s: float = Field(default=3600.0, gt=0)
    # Results cut short by the budget: 0 = never cached; else cached this long (and flagged on a hit).
    degraded_ttl_s: float = Field(default=0.0, ge=0)
    # In-process LRU bounds.
    max_entries: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Key prefix in Redis; sidecars serving different corpora on one Redis need different ones.
    namespace: str = "ragserve"
    # The most a Redis call may add to a request (also bounds a paused or stopped server).
    redis_timeout_ms: float = Field(default=20.0, gt=0)
    redis_connect_timeout_ms: float = Field(default=200.0, gt=0)
    # As many as requests may be in flight (RAGSERVE_MAX_IN_FLIGHT): waiting for a connection is a local
    # bottleneck, not a Redis failure, yet it would count against the breaker.
    redis_pool_size: int = Field(default=64, ge=1)
    redis_health_check_interval_s: float = Field(default=5.0, ge=0)
    # Circuit breaker: open after this many consecutive failures, probe again after the cool-down.
    breaker_failures: int = Field(default=3, ge=1)
    breaker_cooldown_s: float = Field(default=1.0, ge=0)
    # Semantic reuse of a near-duplicate query's entry (guarded against changes in meaning).
    semantic: bool = False
    semantic_threshold: float = Field(default=0.95, gt=0, le=1)
    semantic_window: int = Field(default=1024, ge=1)
    # Near-duplicates the meaning guard may compare per lookup (best first): bounds a lookup's work
    # however many crafted variants of one question were stored.
    semantic_max_candidates: int = Field(default=8, ge=1)
    # Largest entry written or read (bytes); a larger one in the store is refused unparsed (a miss).
    # 1 MiB: room for top_k=50 long passages, or an answer at the 64 KiB text cap with its passages.
    max_entry_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Authenticate entries (HMAC-SHA256, >= 16 bytes): an entry without a valid MAC is a miss, so
    # whoever can write to Redis cannot plant passages or answers. The same key on every sidecar
    # sharing a Redis; set the key or a file holding it (read once at start-up), not both.
    hmac_key: SecretStr | None = None
    hmac_key_file: Path | None = None
    # A Redis cache without a key is refused at start-up unless this says unsigned entries are
    # accepted knowingly (a Redis only this sidecar can reach, say).
    allow_unsigned: bool = False
    # Answers to temperature-0 Query requests, replayed without the engine when asked again. On the
    # same backend, with its own entries (and, in process, its own LRU with the bounds above).
    answers: bool = True
    answer_ttl_s: float = Field(default=3600.0, gt=0)

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if self.hmac_key is not None and self.hmac_key_file is not None:
            raise ValueError("set RAGSERVE_CACHE_HMAC_KEY or RAGSERVE_CACHE_HMAC_KEY_FILE, not both")
        return self


class TransportSettings(BaseSettings):
    """Where the server listens and how its connections behave. Variables: RAGSERVE_HOST, RAGSERVE_PORT, ..."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # Listening: loopback by default; a Unix socket path takes precedence when set.
    host: str = "127.0.0.1"
    port: int = 50051
    uds_path: str = ""
    # Keepalive for long-lived sidecar channels: clients may ping every keepalive_min_ping_ms.
    keepalive_time_ms: int = 30_000
    keepalive_timeout_ms: int = 10_000
    keepalive_min_ping_ms: int = 10_000
    # Connections are recycled after this age (0 = never), with a grace period for open calls.
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 30_000
    max_message_bytes: int = 4 * 1024 * 1024
    # Calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); at least
    # max_in_flight + max_side_streams, so an overloaded caller on one channel is refused, not queued
    # (checked by Settings).
    max_concurrent_streams: int = Field(default=128, ge=1)
    # A connection with no call open for this long is closed (GOAWAY); 0 = never. Clients reconnect
    # by themselves on their next call.
    max_connection_idle_ms: int = Field(default=600_000, ge=0)
    # Grace period for open calls when the server stops (SIGTERM).
    shutdown_grace_s: float = 10.0
    # Once SERVING, what start-up made is frozen out of the garbage collector's sight: a full
    # collection then walks what came after, not half a million objects (ragserve/heap.py).
    freeze_start_up_heap: bool = True


class AccessSettings(BaseSettings):
    """Who may call. Loopback and Unix sockets need nothing; any other address requires
    allow_non_loopback, TLS (tls_cert_file/tls_key_file), and client certificates or an auth token.
    Variables: RAGSERVE_ALLOW_NON_LOOPBACK, RAGSERVE_AUTH_TOKEN, RAGSERVE_API_KEYS_FILE, RAGSERVE_TLS_*."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    allow_non_loopback: bool = False
    auth_token: str = Field(default="", repr=False)
    # Named API keys: a file of caller names and key hashes (`ragserve keys add NAME`), re-read when
    # it changes; a key names its caller for grants and caller limits, as a certificate does.
    api_keys_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # With a CA file, clients must present a certificate signed by it (mTLS).
    tls_client_ca_file: str = ""
    # mTLS pinning: comma-separated certificate names (CN or SAN) allowed to call; empty: any the CA signed.
    tls_allowed_client_ids: str = ""

    @model_validator(mode="after")
    def _pinning_needs_client_certificates(self) -> Self:
        if self.tls_allowed_client_ids and not self.tls_client_ca_file:
            raise ValueError("RAGSERVE_TLS_ALLOWED_CLIENT_IDS needs client certificates (RAGSERVE_TLS_CLIENT_CA_FILE)")
        return self


class IndexSettings(BaseSettings):
    """Which index is served. Variables use the RAGSERVE_INDEX_ prefix (RAGSERVE_INDEX_PATH, ...)."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_INDEX_", extra="forbid", frozen=True)

    # The published hnswlib+BM25 folder (holds CURRENT).
    path: Path = Field(default_factory=lambda: default_home() / "index" / "sample")
    # hnsw: the folder at `path`; qdrant: a Qdrant collection (QdrantSettings).
    backend: Literal["hnsw", "qdrant"] = "hnsw"
    # Seconds between checks of the index root for a newly published version (0 = no hot reload).
    reload_interval_s: float = Field(default=2.0, ge=0.0)
    # A version of at least this many chunks keeps its HNSW graph in a helper process. hnswlib's
    # load holds the GIL (some 2 us a chunk), which would stall every request of a hot reload; in a
    # helper it stalls none, and each search pays a local round trip (0 = every version).
    graph_process_min_chunks: int = Field(default=20_000, ge=0)


class QdrantSettings(BaseSettings):
    """The Qdrant index backend. Variables use the RAGSERVE_QDRANT_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_QDRANT_", extra="forbid", frozen=True)

    # A server/cluster URL (http://host:6333), ":memory:", or a local folder path.
    url: str = ""
    api_key: str = Field(default="", repr=False)
    # The collection alias the indexer flips to each new version.
    collection: str = "ragserve"
    # Qdrant searches run on their own threads, so a slow or black-holed Qdrant never holds the
    # embedding threads; each search waits at most the request's budget (but at least
    # min_search_ms, so a nearly spent budget still gets one honest try) and then answers
    # UNAVAILABLE. A thread stuck in a call is freed by the client's own timeout (timeout_s).
    search_threads: int = Field(default=4, ge=1)
    min_search_ms: float = Field(default=25.0, ge=0.0)
    timeout_s: int = Field(default=5, ge=1)


class EmbedderSettings(BaseSettings):
    """The query embedder (the indexer builds its own through the same factory). Variables use the
    RAGSERVE_EMBEDDER_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_EMBEDDER_", extra="forbid", frozen=True)

    model: str = DEFAULT_EMBEDDER
    device: Literal["cpu", "cuda"] = "cpu"
    # onnx (int8, exported once to a cache folder) embeds a query several times faster than torch
    # fp32 on a small CPU at the same quality (BENCHMARKS.md, "Indexing"). On CUDA torch is used.
    backend: Literal["torch", "onnx"] = "onnx"
    onnx_int8: bool = True
    # ONNX Runtime threads per query embedding (0: ORT's default, one per core). One measured
    # faster for a single short query and under concurrent callers (BENCHMARKS.md, "Indexing").
    threads: int = Field(default=1, ge=0)


class RetrievalSettings(BaseSettings):
    """How candidates are searched and fused. Variables: RAGSERVE_RETRIEVAL_MODE, RAGSERVE_FUSION*,
    RAGSERVE_RRF_K, RAGSERVE_HNSW_EF_SEARCH."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # dense (HNSW only), bm25 (lexical only) or hybrid (both, fused).
    retrieval_mode: Literal["dense", "bm25", "hybrid"] = "hybrid"
    # weighted (min-max normalized scores, dense weight below) or rrf (reciprocal rank fusion).
    # Weighted with this weight measured best on SciFact (BENCHMARKS.md, "Indexing and hybrid
    # retrieval"); rrf needs no tuning and is the safer choice for a very different corpus.
    fusion: Literal["rrf", "weighted"] = "weighted"
    fusion_dense_weight: float = Field(default=0.4, ge=0.0, le=1.0)
    # A version published by `ragserve-index tune` records the dense weight fitted for its tuned model on
    # held-back queries (manifest `tuning.fusion_dense_weight`); true: that version is served with
    # it instead of fusion_dense_weight. Versions without one are unaffected.
    fusion_weight_from_index: bool = True
    rrf_k: int = Field(default=60, ge=1)
    # Candidates taken from each list before fusing.
    fusion_candidates: int = Field(default=100, ge=1)
    # HNSW breadth at query time: at least top_k, usually more for recall.
    hnsw_ef_search: int = 64


class RequestSettings(BaseSettings):
    """What a request gets when it leaves a field at 0, and the most it may ask for.
    Variables: RAGSERVE_DEFAULT_TOP_K, RAGSERVE_MAX_TOP_K, RAGSERVE_RETRIEVAL_BUDGET_MS, ..."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # Passages per answer: each adds ~200 prompt tokens (TTFT) and, for a small model, distraction.
    default_top_k: int = 3
    max_top_k: int = 50
    # Retrieval+rerank budget of a request that sets none.
    retrieval_budget_ms: int = Field(default=70, ge=1)
    # The largest per-request budget_ms accepted; above it, INVALID_ARGUMENT (field budget_ms).
    max_budget_ms: int = Field(default=60_000, ge=1)
    max_query_chars: int = 2000
    # Most passage tokens in a Query's prompt: each passage is cut to the sentences that best match
    # the question (ragserve/request/context.py). 0 keeps whole passages. Per request: context_token_budget.
    context_token_budget: int = Field(default=128, ge=0)

    @model_validator(mode="after")
    def _default_within_cap(self) -> Self:
        if self.default_top_k > self.max_top_k:
            raise ValueError(
                f"RAGSERVE_DEFAULT_TOP_K ({self.default_top_k}) must be at most RAGSERVE_MAX_TOP_K ({self.max_top_k})"
            )
        if self.retrieval_budget_ms > self.max_budget_ms:
            raise ValueError(
                f"RAGSERVE_RETRIEVAL_BUDGET_MS ({self.retrieval_budget_ms}) must be at most "
                f"RAGSERVE_MAX_BUDGET_MS ({self.max_budget_ms})"
            )
        return self


class LimitsSettings(BaseSettings):
    """Work the server takes on at once, and for how long. Variables: RAGSERVE_MAX_IN_FLIGHT, ..."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # Threads for model calls (embedding), kept off the event loop.
    model_threads: int = 2
    max_in_flight: int = 64
    # Health Watch and reflection streams open at once (they stay open as long as the caller likes
    # and take no in-flight slot); beyond it RESOURCE_EXHAUSTED.
    max_side_streams: int = Field(default=16, ge=1)
    # Longest a Retrieve or Query call may run, whatever deadline the client set (none, or a longer
    # one): then DEADLINE_EXCEEDED, the engine request is aborted and the in-flight slot freed, also
    # when the client has stopped reading the stream.
    max_call_s: float = Field(default=300.0, gt=0)
    # What an overloaded caller is told to wait before retrying (grpc-retry-pushback-ms).
    overload_retry_after_ms: int = 100
    # Batch requests (request_class BATCH) may hold at most this share of max_in_flight...
    batch_max_share: float = Field(default=0.5, gt=0.0, le=1.0)
    # ...and never these last slots: people are never refused because a job is running.
    interactive_reserved: int = Field(default=2, ge=0)
    # Batch Query streams in the generator at once (vLLM does not preempt for priority while its
    # running batch is full: vLLM issue 40004); more wait, within their deadline. 0: no cap.
    batch_max_engine_seqs: int = Field(default=4, ge=0)
    # Per caller (the name of its API key, or on its mTLS client certificate, CN or SAN): the highest request class it
    # may use and its calls in flight, as `name=class:cap` pairs, e.g.
    # `reports-job=batch:4,web=interactive:48,*=batch:8` (`*`: every caller no other pair names, a
    # caller without a key or certificate too, all in one shared cap). A caller asking above its class is
    # served at its class; a certificate with several named names gets the most restrictive pair.
    # Empty: the class is the caller's word (docs/api.md).
    caller_limits: str = ""

    @model_validator(mode="after")
    def _caller_limits_parse(self) -> Self:
        parse_caller_limits(self.caller_limits)
        return self


def parse_caller_limits(text: str) -> dict[str, tuple[str, int]]:
    """`name=class:cap,...` -> {name: (class, cap)}; ValueError naming the bad pair (a name given
    twice too: which of the two was meant cannot be guessed)."""
    limits: dict[str, tuple[str, int]] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, _, rule = pair.partition("=")
        level, _, cap = rule.partition(":")
        if not name.strip() or level.strip() not in ("interactive", "batch") or not cap.strip().isdigit():
            raise ValueError(f"RAGSERVE_CALLER_LIMITS: {pair!r} is not name=interactive|batch:cap")
        if int(cap) < 1:
            raise ValueError(f"RAGSERVE_CALLER_LIMITS: {pair!r}: the cap must be at least 1")
        if name.strip() in limits:
            raise ValueError(f"RAGSERVE_CALLER_LIMITS: {name.strip()!r} is named twice")
        limits[name.strip()] = (level.strip(), int(cap))
    return limits


class ObservabilitySettings(BaseSettings):
    """Tracing, metrics and health probing. Variables: RAGSERVE_TRACING_*, RAGSERVE_METRICS_*,
    RAGSERVE_HEALTH_PROBE_INTERVAL_S."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # OpenTelemetry spans per request and per stage, continuing the caller's trace (W3C
    # traceparent in gRPC metadata). Exported over OTLP/gRPC when an endpoint is set, else to stderr.
    tracing_enabled: bool = False
    tracing_otlp_endpoint: str = ""
    # Prometheus /metrics on a separate port (0 = off); loopback unless configured otherwise.
    metrics_port: int = 9464
    metrics_host: str = "127.0.0.1"
    # Metrics connections open at once (a new one replaces the oldest still sending its request),
    # and the most time one connection may take, request to last byte of the response.
    metrics_max_connections: int = Field(default=16, ge=1)
    metrics_timeout_s: float = Field(default=5.0, gt=0)
    # How often the generator's health is probed; a dead engine turns health NOT_SERVING.
    health_probe_interval_s: float = 2.0
    # A probe that has not answered by then counts as failed (a hung engine must not hold health SERVING).
    health_probe_timeout_s: float = Field(default=5.0, gt=0)
