"""Domain values <-> protobuf messages. Nothing else in the server builds messages by hand."""

from __future__ import annotations

from typing import TypeVar

from ragserve.events import Citation, DeclineEvidence, LateAnswer, QueryEvent, TokenDelta
from ragserve.reports import EngineChoice, HostShareState, PipelineInfo, WarmState
from ragserve.request.source_view import SourceView
from ragserve.source_location import SourceLocation
from ragserve.types import (
    AnswerSpan,
    Chunk,
    Degraded,
    Highlight,
    Passage,
    RequestClass,
    RetrievalResult,
    StageTimings,
    Support,
)
from ragserve.v1 import rag_pb2 as pb

# The two messages that carry a retrieval result: the Retrieve reply and the Query stream's first event.
RetrievalMessage = TypeVar("RetrievalMessage", pb.RetrieveResponse, pb.RetrievalEvent)


_CLASS_PB = {RequestClass.INTERACTIVE: pb.REQUEST_CLASS_INTERACTIVE, RequestClass.BATCH: pb.REQUEST_CLASS_BATCH}


def passage_pb(passage: Passage) -> pb.Passage:
    chunk = passage.chunk
    return pb.Passage(
        doc_id=chunk.doc_id,
        chunk_id=chunk.chunk_id,
        text=chunk.text,
        score=passage.score,
        title=chunk.title,
        rank=passage.rank,
        highlight=highlight_pb(passage.highlight),
        location=location_pb(chunk),
    )


def location_pb(chunk: Chunk, where: SourceLocation | None = None) -> pb.SourceLocation | None:
    """A chunk's location (`where`: a place inside it, as a citation's quote has it)."""
    where = where or chunk.location
    if where is None:
        return None
    return pb.SourceLocation(
        locator=where.locator,
        page=where.page,
        page_start=where.page_start,
        section=where.section,
        start=chunk.start,
        end=chunk.end,
    )


def citation_pb(citation: Citation) -> pb.Citation:
    return pb.Citation(
        marker=citation.marker,
        answer_start=citation.answer_start,
        answer_end=citation.answer_end,
        passage=citation.passage,
        doc_id=citation.chunk.doc_id,
        chunk_id=citation.chunk.chunk_id,
        location=location_pb(citation.chunk, citation.location),
        quote=citation.quote,
        quote_start=citation.quote_start,
        quote_end=citation.quote_end,
        supported=citation.supported,
    )


def highlight_pb(highlight: Highlight | None) -> pb.Highlight | None:
    if highlight is None:
        return None
    return pb.Highlight(start=highlight.start, end=highlight.end, coverage=highlight.coverage)


def support_pb(support: Support | None) -> pb.Support | None:
    if support is None:
        return None
    return pb.Support(coverage=support.coverage, low=support.low, evidence_passage=support.evidence_passage)


def answer_span_pb(span: AnswerSpan | None) -> pb.AnswerSpan | None:
    if span is None:
        return None
    return pb.AnswerSpan(
        passage=span.passage,
        start=span.start,
        end=span.end,
        text=span.text,
        margin=span.margin,
        answers=span.answers,
        sentence_start=span.sentence_start,
        sentence_end=span.sentence_end,
    )


def timings_pb(t: StageTimings) -> pb.StageTimings:
    return pb.StageTimings(
        embed_ms=t.embed_ms,
        search_ms=t.search_ms,
        rerank_ms=t.rerank_ms,
        retrieval_total_ms=t.retrieval_total_ms,
        prompt_ms=t.prompt_ms,
        ttft_ms=t.ttft_ms,
        generation_ms=t.generation_ms,
        total_ms=t.total_ms,
        time_per_output_token_ms=t.time_per_output_token_ms,
        cache_ms=t.cache_ms,
        answer_cache_ms=t.answer_cache_ms,
        context_ms=t.context_ms,
        evidence_ms=t.evidence_ms,
        engine_wait_ms=t.engine_wait_ms,
        reader_ms=t.reader_ms,
    )


def degraded_pb(d: Degraded) -> pb.DegradedFlags:
    return pb.DegradedFlags(
        budget_exhausted=d.budget_exhausted,
        search_truncated=d.search_truncated,
        rerank_skipped=d.rerank_skipped,
        rerank_truncated=d.rerank_truncated,
        notes=[*d.notes, *d.remarks],
    )


def retrieval_pb(result: RetrievalResult, message: type[RetrievalMessage]) -> RetrievalMessage:
    """`message` (RetrieveResponse or RetrievalEvent) filled from `result`: both carry the same fields."""
    return message(
        passages=[passage_pb(p) for p in result.passages],
        timings=timings_pb(result.timings),
        degraded=degraded_pb(result.degraded),
        index_version=result.index_version,
        rerank_tiers=list(result.rerank_tiers),
        cache_hit=result.cache_hit,
        support=support_pb(result.support),
        answer=answer_span_pb(result.answer),
    )


def retrieve_response_pb(result: RetrievalResult) -> pb.RetrieveResponse:
    return retrieval_pb(result, pb.RetrieveResponse)


def query_event_pb(event: QueryEvent) -> pb.QueryEvent:
    if isinstance(event, TokenDelta):
        return pb.QueryEvent(token=pb.TokenEvent(text=event.text))
    if isinstance(event, LateAnswer):
        return pb.QueryEvent(answer=pb.AnswerEvent(answer=answer_span_pb(event.answer), reader_ms=event.reader_ms))
    if isinstance(event, RetrievalResult):
        return pb.QueryEvent(retrieval=retrieval_pb(event, pb.RetrievalEvent))
    if isinstance(event, Citation):
        return pb.QueryEvent(citation=citation_pb(event))
    return pb.QueryEvent(
        final=pb.FinalEvent(
            usage=pb.Usage(
                prompt_tokens=event.usage.prompt_tokens,
                completion_tokens=event.usage.completion_tokens,
                prefix_cache_hit_tokens=event.usage.prefix_cache_hit_tokens,
                draft_tokens=event.usage.draft_tokens,
                accepted_draft_tokens=event.usage.accepted_draft_tokens,
                context_tokens=event.context_tokens,
                context_tokens_full=event.context_tokens_full,
            ),
            timings=timings_pb(event.timings),
            degraded=degraded_pb(event.degraded),
            finish_reason=event.finish_reason,
            request_class=_CLASS_PB[event.request_class],
            generator_model=event.generator_model,
            answer_cache_hit=event.answer_cache_hit,
            declined=event.declined,
            decline_evidence=decline_evidence_pb(event.decline_evidence),
            citations=[citation_pb(c) for c in event.citations],
            unsupported=event.unsupported,
        )
    )


def source_response_pb(view: SourceView | None, version: str) -> pb.SourceResponse:
    if view is None:
        return pb.SourceResponse(found=False, index_version=version)
    chunk = view.chunk
    return pb.SourceResponse(
        found=True,
        doc_id=chunk.doc_id,
        title=chunk.title,
        location=location_pb(chunk, view.location),
        text=view.text,
        text_start=view.text_start,
        quote_start=view.quote_start,
        quote_end=view.quote_end,
        index_version=version,
    )


def decline_evidence_pb(evidence: DeclineEvidence | None) -> pb.DeclineEvidence | None:
    if evidence is None:
        return None
    return pb.DeclineEvidence(score=evidence.score, threshold=evidence.threshold, signals=evidence.signals)


def engine_setting_pb(choice: EngineChoice) -> pb.EngineSetting:
    return pb.EngineSetting(name=choice.name, value=choice.value, reason=choice.reason)


def info_response_pb(info: PipelineInfo, retrieval_budget_ms: int, requests_in_flight: int) -> pb.InfoResponse:
    """What a loaded server runs; the budget and the in-flight count are the server's, not the pipeline's."""
    share = info.generator.host_share
    return pb.InfoResponse(
        index_version=info.index_version,
        index_chunks=info.index_chunks,
        embedder_model=info.embedder_model,
        generator_model=info.generator_model,
        rerank_tiers=list(info.rerank_tiers),
        retrieval_budget_ms=retrieval_budget_ms,
        generator_unfinished_requests=info.generator_unfinished_requests,
        requests_in_flight=requests_in_flight,
        generator_settings=[engine_setting_pb(c) for c in info.generator_settings],
        host_cpu=info.host_cpu,
        generator_pace=info.generator_pace,
        generator_servers=[
            pb.GeneratorServer(url=s.url, up=s.up, in_flight=s.in_flight) for s in info.generator.servers
        ],
        host_share=host_share_pb(share) if share is not None else None,
        warming=warming_pb(info.warming),
        index_served_s=info.index_served_s,
        last_reload_refusal=info.last_reload_refusal,
        reader_model=info.reader_model,
        reader_threshold=info.reader_threshold,
    )


def warming_pb(state: WarmState) -> pb.Warming:
    return pb.Warming(
        passages=state.passages,
        tokens=state.tokens,
        left_out=state.left_out,
        done=state.done,
        seconds=state.seconds,
        planned=state.planned,
    )


def host_share_pb(share: HostShareState) -> pb.HostShare:
    return pb.HostShare(
        usable_cpus=share.usable_cpus,
        neighbour_cpus=share.neighbour_cpus,
        engine_threads=share.engine_threads,
        adaptive=share.adaptive,
    )
