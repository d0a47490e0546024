"""Prometheus metrics: defined once here, fed from the stage timings recorded per request."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Milliseconds: from sub-ms cache hits to multi-second generations.
_MS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 35, 50, 70, 100, 150, 250, 500, 1000, 2500, 5000, 10000, 30000)

STAGE_MS = Histogram(
    "ragserve_stage_latency_ms",
    "Latency of one request stage in milliseconds",
    ["stage"],
    buckets=_MS_BUCKETS,
)
REQUESTS = Counter("ragserve_requests_total", "Requests by method and final gRPC status", ["method", "code"])
IN_FLIGHT = Gauge("ragserve_in_flight_requests", "Requests admitted and not yet finished")
# By request class (interactive, batch): refused at admission, and time to first token.
SHED = Counter("ragserve_shed_total", "Requests refused at admission (RESOURCE_EXHAUSTED) by class", ["request_class"])
TTFT_BY_CLASS = Histogram(
    "ragserve_ttft_ms", "Time to first token in milliseconds by class", ["request_class"], buckets=_MS_BUCKETS
)
MODEL_QUEUE_MS = Histogram(
    "ragserve_model_queue_wait_ms",
    "Time a model call (embed, rerank, prompt work) waited for a model thread, by class",
    ["request_class"],
    buckets=_MS_BUCKETS,
)
ENGINE_WAIT_MS = Histogram(
    "ragserve_batch_engine_wait_ms", "Batch Query time waiting for batch's share of the generator", buckets=_MS_BUCKETS
)
DEGRADED = Counter("ragserve_degraded_total", "Requests that were cut short to hold the budget, by kind", ["kind"])
RERANK_DEPTH = Histogram(
    "ragserve_rerank_depth", "Pairs scored by each rerank tier", ["tier"], buckets=(0, 1, 2, 5, 10, 20, 50, 100)
)
CACHE_REQUESTS = Counter("ragserve_cache_requests_total", "Retrieval cache lookups", ["backend", "result"])
CACHE_ERRORS = Counter("ragserve_cache_errors_total", "Retrieval cache backend failures", ["backend", "kind"])
CACHE_CIRCUIT_OPEN = Gauge("ragserve_cache_circuit_open", "1 while the cache backend is skipped", ["backend"])
# A stored entry refused on read (too large, unauthenticated, malformed, out of bounds, another index
# or query): served as a miss. reason is one of those words.
CACHE_REJECTED = Counter(
    "ragserve_cache_rejected_entries_total", "Retrieval cache entries refused on read", ["backend", "reason"]
)
# The answer cache has its own series (its own breaker too): one result per lookup (hit, miss, error,
# skipped) plus "stored" per answer written.
ANSWER_CACHE_REQUESTS = Counter(
    "ragserve_answer_cache_requests_total", "Answer cache lookups and stored answers", ["backend", "result"]
)
ANSWER_CACHE_ERRORS = Counter(
    "ragserve_answer_cache_errors_total", "Answer cache backend failures", ["backend", "kind"]
)
ANSWER_CACHE_CIRCUIT_OPEN = Gauge(
    "ragserve_answer_cache_circuit_open", "1 while the answer cache backend is skipped", ["backend"]
)
ANSWER_CACHE_REJECTED = Counter(
    "ragserve_answer_cache_rejected_entries_total", "Answer cache entries refused on read", ["backend", "reason"]
)
PROMPT_TOKENS = Counter("ragserve_prompt_tokens_total", "Prompt tokens sent to the generator")
PREFIX_CACHE_HIT_TOKENS = Counter(
    "ragserve_prefix_cache_hit_tokens_total", "Prompt tokens served from the generator's prefix cache"
)
SPEC_DRAFT_TOKENS = Counter("ragserve_spec_draft_tokens_total", "Speculative draft tokens proposed")
SPEC_ACCEPTED_TOKENS = Counter("ragserve_spec_accepted_tokens_total", "Speculative draft tokens accepted")
COMPLETION_TOKENS = Counter("ragserve_completion_tokens_total", "Tokens generated")

# A remote generator's servers (RAGSERVE_GENERATOR_BACKEND=remote), by base URL.
# Recent decode ms/token of answers that had the engine alone, over its pace measured alone at start
# (generate/host_share.py): from 2.5 a neighbour is taking this engine's CPUs.
GENERATOR_PACE_RATIO = Gauge("ragserve_generator_pace_ratio", "Decode time per token relative to this host's idle pace")
# generate/host_share.py: what other processes keep busy of the server's CPUs, and the engine's answer.
HOST_NEIGHBOUR_CPUS = Gauge(
    "ragserve_host_neighbour_cpus", "CPUs' worth of time other processes use on this server's CPUs (last 0.5 s)"
)
ENGINE_YIELD_SECONDS = Counter(
    "ragserve_engine_yield_seconds_total",
    "Seconds the in-process engine waited between steps for interactive retrievals",
)
ENGINE_STEP_TOKENS = Gauge(
    "ragserve_engine_step_tokens", "Most prompt tokens one engine step schedules (the step target's prefill chunk)"
)
GENERATOR_THREADS = Gauge("ragserve_generator_threads", "Threads the local engine runs its next step with")
REPLICA_UP = Gauge("ragserve_generator_server_up", "1 while the generation server can take requests", ["server"])
REPLICA_IN_FLIGHT = Gauge("ragserve_generator_server_in_flight", "Requests open on the generation server", ["server"])
REPLICA_REQUESTS = Counter(
    "ragserve_generator_server_requests_total",
    "Requests to a generation server by outcome (ok, failed)",
    ["server", "outcome"],
)
REPLICA_HEDGES = Counter("ragserve_generator_hedges_total", "Prompts sent to a second server after the hedge bound")
WARM_PASSAGES = Gauge("ragserve_warm_passages", "Passages of the serving version pre-filled in the KV cache")
WARM_TOKENS = Gauge("ragserve_warm_tokens", "Prompt tokens those pre-filled passages add to the template's")
WARM_LEFT_OUT = Gauge(
    "ragserve_warm_left_out_passages", "Passages of the serving version left cold (past RAGSERVE_WARM_KV_SHARE)"
)
QUERY_TOP_WARM = Counter(
    "ragserve_query_top_passage_warm_total", "Queries whose top passage had been pre-filled (warm) or not", ["warm"]
)
# A Query answered with the decline sentence: by the generator (the tuned adapter's trained reply)
# or by the server itself (abstention, without the engine). Answer-cache replays count too.
QUERY_DECLINED = Counter(
    "ragserve_query_declined_total", "Queries answered that the documents do not contain the answer", ["by"]
)

# Export the rerank series from the start, at zero, so dashboards see them even with reranking off.
for _tier in ("tier1", "tier2"):
    RERANK_DEPTH.labels(_tier)
for _class in ("interactive", "batch"):
    SHED.labels(_class)

# A corpus that silently stops updating: when the serving version started serving here, and the
# hot reloads refused (the old version keeps serving; docs/operations.md, "What to alert on").
INDEX_SERVED_SINCE = Gauge(
    "ragserve_index_served_since_timestamp_seconds", "When the serving index version started serving (Unix time)"
)
INDEX_RELOADS_REFUSED = Counter(
    "ragserve_index_reloads_refused_total", "Newly published index versions refused (the old one keeps serving)"
)
INDEX_GRAPH_HELPER_RESTARTS = Counter(
    "ragserve_index_graph_helper_restarts_total",
    "Times a big version's graph helper process was gone (died, or hung) and was started again",
)
INDEX_LAST_REFUSAL = Gauge(
    "ragserve_index_last_refusal_timestamp_seconds", "When a newly published index version was last refused (Unix time)"
)
