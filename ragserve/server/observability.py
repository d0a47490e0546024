"""Stage timings recorded once per request feed the metrics here (and the response and logs elsewhere)."""

from __future__ import annotations

from ragserve import metrics
from ragserve.events import FinalSummary
from ragserve.types import RetrievalResult

_DEGRADED_KINDS = ("budget_exhausted", "search_truncated", "rerank_skipped", "rerank_truncated")


def observe_retrieval(result: RetrievalResult) -> None:
    t = result.timings
    for stage, value in (
        ("cache", t.cache_ms),
        ("embed", t.embed_ms),
        ("search", t.search_ms),
        ("rerank", t.rerank_ms),
    ):
        if value > 0:
            metrics.STAGE_MS.labels(stage).observe(value)
    metrics.STAGE_MS.labels("retrieval").observe(t.retrieval_total_ms)
    for kind in _DEGRADED_KINDS:
        if getattr(result.degraded, kind):
            metrics.DEGRADED.labels(kind).inc()
    for tier in result.rerank_tiers:
        name, _, depth = tier.partition(":")
        if depth.isdigit():
            metrics.RERANK_DEPTH.labels(name).observe(int(depth))


def observe_final(summary: FinalSummary) -> None:
    t = summary.timings
    if t.answer_cache_ms > 0:
        metrics.STAGE_MS.labels("answer_cache").observe(t.answer_cache_ms)
    if t.ttft_ms > 0:
        metrics.STAGE_MS.labels("ttft").observe(t.ttft_ms)
        metrics.TTFT_BY_CLASS.labels(summary.request_class.value).observe(t.ttft_ms)
    if t.engine_wait_ms > 0:
        metrics.ENGINE_WAIT_MS.observe(t.engine_wait_ms)
    metrics.STAGE_MS.labels("query_total").observe(t.total_ms)
    if summary.declined:
        metrics.QUERY_DECLINED.labels("server" if summary.finish_reason == "abstained" else "generator").inc()
    if summary.answer_cache_hit:
        return  # the engine was not asked: no prompt, generation or tokens to count for this request
    metrics.STAGE_MS.labels("prompt").observe(t.prompt_ms)
    if t.time_per_output_token_ms > 0:
        metrics.STAGE_MS.labels("time_per_output_token").observe(t.time_per_output_token_ms)
    metrics.STAGE_MS.labels("generation").observe(t.generation_ms)
    metrics.PROMPT_TOKENS.inc(summary.usage.prompt_tokens)
    metrics.PREFIX_CACHE_HIT_TOKENS.inc(summary.usage.prefix_cache_hit_tokens)
    metrics.COMPLETION_TOKENS.inc(summary.usage.completion_tokens)
    metrics.SPEC_DRAFT_TOKENS.inc(summary.usage.draft_tokens)
    metrics.SPEC_ACCEPTED_TOKENS.inc(summary.usage.accepted_draft_tokens)


def observe_request(method: str, code: str, total_ms: float) -> None:
    metrics.REQUESTS.labels(method, code).inc()
    metrics.STAGE_MS.labels(f"{method.lower()}_end_to_end").observe(total_ms)
