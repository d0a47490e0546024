"""Domain values -> protobuf messages: what the servicer sends is exactly what the pipeline produced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from ragserve.events import FinalSummary, LateAnswer, TokenDelta, Usage
from ragserve.reports import EngineChoice, GeneratorStatus, HostShareState, WarmState
from ragserve.request.pipeline import RagPipeline
from ragserve.server.convert import (
    info_response_pb,
    query_event_pb,
    retrieval_pb,
    retrieve_response_pb,
)
from ragserve.types import AnswerSpan, Chunk, Degraded, Highlight, Passage, RetrievalResult, StageTimings, Support
from ragserve.v1 import rag_pb2 as pb


def _result() -> RetrievalResult:
    return RetrievalResult(
        passages=[
            Passage(Chunk("d1#0", "d1", "first text", title="One"), score=0.91, rank=1, highlight=Highlight(0, 5, 0.5)),
            Passage(Chunk("d2#3", "d2", "second text", title="Two"), score=0.5, rank=2),
        ],
        timings=StageTimings(embed_ms=1.5, search_ms=2.25, rerank_ms=3.0, retrieval_total_ms=7.0, cache_ms=0.25),
        degraded=Degraded(rerank_truncated=True, notes=["rerank cut to 10"]),
        index_version="7",
        rerank_tiers=["tier1:20"],
        cache_hit=True,
        support=Support(0.5, low=True, evidence_passage=1),
        answer=AnswerSpan(0, 0, 5, "first", 2.5, True, 0, 10),
    )


def _fields(message: Any) -> list[tuple[int, str, int, str]]:
    return [
        (f.number, f.name, f.type, f.message_type.full_name if f.message_type else "")
        for f in message.DESCRIPTOR.fields
    ]


def test_retrieve_response_carries_the_result() -> None:
    response = retrieve_response_pb(_result())
    assert [(p.doc_id, p.chunk_id, p.text, p.title, p.rank) for p in response.passages] == [
        ("d1", "d1#0", "first text", "One", 1),
        ("d2", "d2#3", "second text", "Two", 2),
    ]
    assert response.passages[0].score == pb.Passage(score=0.91).score
    assert response.timings.embed_ms == 1.5
    assert response.timings.search_ms == 2.25
    assert response.timings.cache_ms == 0.25
    assert response.timings.retrieval_total_ms == 7.0
    assert response.degraded.rerank_truncated and not response.degraded.rerank_skipped
    assert list(response.degraded.notes) == ["rerank cut to 10"]
    assert response.index_version == "7"
    assert list(response.rerank_tiers) == ["tier1:20"]
    assert response.cache_hit
    first, second = response.passages
    assert (first.highlight.start, first.highlight.end, first.highlight.coverage) == (0, 5, 0.5)
    assert not second.HasField("highlight")  # a passage with no sentence has none
    assert response.support.low and response.support.coverage == 0.5 and response.support.evidence_passage == 1


def test_retrieve_response_and_retrieval_event_carry_the_same_fields_from_the_same_result() -> None:
    # The two messages are one shape under two names: same field numbers, names and types...
    assert _fields(pb.RetrieveResponse) == _fields(pb.RetrievalEvent)
    result = _result()
    response = retrieve_response_pb(result)
    event = query_event_pb(result)
    assert event.WhichOneof("event") == "retrieval"
    # ...and the same result fills both alike: every field set, same values, same wire bytes.
    assert MessageToDict(response) == MessageToDict(event.retrieval)
    assert response.SerializeToString(deterministic=True) == event.retrieval.SerializeToString(deterministic=True)
    assert {f.name for f, _ in response.ListFields()} == {f.name for f in pb.RetrieveResponse.DESCRIPTOR.fields}
    assert retrieval_pb(result, pb.RetrievalEvent) == event.retrieval


def test_token_and_final_events() -> None:
    assert query_event_pb(TokenDelta("hel")).token.text == "hel"
    final = query_event_pb(
        FinalSummary(
            usage=Usage(prompt_tokens=120, completion_tokens=8, prefix_cache_hit_tokens=64, draft_tokens=4),
            timings=StageTimings(ttft_ms=40.0, total_ms=90.0),
            degraded=Degraded(),
            finish_reason="stop",
            generator_model="gen",
            context_tokens=50,
            context_tokens_full=80,
            answer_cache_hit=True,
            declined=True,
        )
    ).final
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.prefix_cache_hit_tokens) == (
        120,
        8,
        64,
    )
    assert (final.usage.context_tokens, final.usage.context_tokens_full, final.usage.draft_tokens) == (50, 80, 4)
    assert final.timings.ttft_ms == 40.0
    assert (final.finish_reason, final.generator_model, final.answer_cache_hit) == ("stop", "gen", True)
    assert final.declined


def _pipeline(generator: Any, reranker: Any) -> Any:
    """The parts Info reads, as a RagPipeline sees them (a fake: no models)."""
    serving = SimpleNamespace(
        index=SimpleNamespace(version="3", count=111, count_matching=lambda grant: 111 if grant is None else 7),
        embedder=SimpleNamespace(model_id="emb"),
        reranker=reranker,
    )
    pipeline = SimpleNamespace(
        serving=serving,
        generator=generator,
        reading=SimpleNamespace(model_id="reader-x", threshold=-1.5),
        versions=SimpleNamespace(served_since=0.0, last_refusal="v000004: checksum"),
        pace=SimpleNamespace(describe=lambda share=None: "normal (decode 1.0x its pace alone, 10.0 ms/token)"),
        warm_state=lambda: WarmState("v3", passages=12, tokens=3400, left_out=2, done=True, seconds=1.5),
    )
    pipeline.info = lambda grant=None, chunks=None: RagPipeline.info(pipeline, grant, chunks)  # type: ignore[arg-type]

    async def info_for(grant: Any) -> Any:
        return pipeline.info(grant)

    pipeline.info_for = info_for
    return pipeline


def _info(pipeline: Any, retrieval_budget_ms: int, requests_in_flight: int) -> pb.InfoResponse:
    return info_response_pb(pipeline.info(), retrieval_budget_ms, requests_in_flight)


def test_info_response_of_a_full_pipeline() -> None:
    generator = SimpleNamespace(
        model_id="gen",
        unfinished_requests=lambda: 2,
        engine_choices=(EngineChoice("threads", "2", "host has 2 cores"),),
        host_cpu="x86_64 avx2",
        status=lambda: GeneratorStatus(on_this_host=True),
    )
    reranker = SimpleNamespace(describe=lambda: ["tier1:20"])
    info = _info(_pipeline(generator, reranker), retrieval_budget_ms=150, requests_in_flight=5)
    assert (info.index_version, info.index_chunks, info.embedder_model, info.generator_model) == (
        "3",
        111,
        "emb",
        "gen",
    )
    assert list(info.rerank_tiers) == ["tier1:20"]
    assert (info.retrieval_budget_ms, info.requests_in_flight, info.generator_unfinished_requests) == (150, 5, 2)
    assert [(s.name, s.value, s.reason) for s in info.generator_settings] == [("threads", "2", "host has 2 cores")]
    assert info.host_cpu == "x86_64 avx2"
    assert (info.warming.passages, info.warming.tokens, info.warming.left_out, info.warming.done) == (12, 3400, 2, True)
    assert info.generator_pace.startswith("normal")
    assert (info.reader_model, info.reader_threshold) == ("reader-x", -1.5)
    assert info.last_reload_refusal == "v000004: checksum" and info.index_served_s > 0


def test_info_reports_the_engines_share_of_the_host() -> None:
    state = HostShareState(usable_cpus=2, neighbour_cpus=1.3, engine_threads=1, adaptive=True)
    generator = SimpleNamespace(
        model_id="gen",
        unfinished_requests=lambda: 0,
        engine_choices=(),
        host_cpu="cpu",
        status=lambda: GeneratorStatus(on_this_host=True, host_share=state),
    )
    info = _info(_pipeline(generator, None), retrieval_budget_ms=70, requests_in_flight=0)
    share = info.host_share
    assert (share.usable_cpus, share.engine_threads, share.adaptive) == (2, 1, True)
    assert share.neighbour_cpus == pytest.approx(1.3)
    unwatched = SimpleNamespace(**{**vars(generator), "status": lambda: GeneratorStatus(on_this_host=True)})
    info = _info(_pipeline(unwatched, None), retrieval_budget_ms=70, requests_in_flight=0)
    assert not info.HasField("host_share")


def test_info_response_without_generator_or_reranker() -> None:
    info = _info(_pipeline(None, None), retrieval_budget_ms=150, requests_in_flight=0)
    assert (info.generator_model, info.generator_unfinished_requests, info.host_cpu) == ("", 0, "")
    assert not info.rerank_tiers and not info.generator_settings
    assert info.index_chunks == 111


def test_info_names_models_without_the_servers_paths() -> None:
    from ragserve.types import model_name

    pipeline = _pipeline(None, None)
    pipeline.serving.embedder = SimpleNamespace(model_id="/srv/secret/models/minilm-tuned")
    info = _info(pipeline, retrieval_budget_ms=150, requests_in_flight=0)
    assert info.embedder_model == "minilm-tuned"
    assert model_name("./models/x") == "x" and model_name("C:\\models\\y") == "y"
    assert model_name("cross-encoder/ms-marco-MiniLM-L-6-v2") == "cross-encoder/ms-marco-MiniLM-L-6-v2"


def test_info_calls_are_counted_like_every_other_call() -> None:
    import asyncio

    from ragserve import metrics
    from ragserve.config import Settings
    from ragserve.server.app import make_front
    from ragserve.server.grpc.servicer import RagServicer

    settings = Settings()
    servicer = RagServicer(make_front(settings, _pipeline(None, None)))
    context = SimpleNamespace(invocation_metadata=lambda: (), time_remaining=lambda: None, auth_context=lambda: {})
    counted = metrics.REQUESTS.labels("Info", "OK")
    before = counted._value.get()
    info = asyncio.run(servicer.Info(pb.InfoRequest(), context))
    assert info.index_version == "3" and counted._value.get() == before + 1


def test_the_readers_span_and_its_late_event() -> None:
    span = AnswerSpan(1, 7, 11, "text", 1.25, True, 0, 11)
    late = query_event_pb(LateAnswer(span, 12.5))
    assert late.WhichOneof("event") == "answer" and late.answer.reader_ms == 12.5
    assert (late.answer.answer.passage, late.answer.answer.text, late.answer.answer.answers) == (1, "text", True)
    assert not query_event_pb(LateAnswer(None, 3.0)).answer.HasField("answer")
    retrieved = retrieve_response_pb(_result())
    assert (retrieved.answer.start, retrieved.answer.end, retrieved.answer.sentence_end) == (0, 5, 10)


def test_info_counts_only_the_chunks_the_callers_grant_reads() -> None:
    from ragserve.filters import Filter, Match

    pipeline = _pipeline(None, None)
    grant = Filter(must=(Match("groups", ("public",), any=True),))
    assert info_response_pb(pipeline.info(grant), 70, 0).index_chunks == 7
    assert info_response_pb(pipeline.info(), 70, 0).index_chunks == 111


def test_a_decline_carries_its_evidence_through_every_door() -> None:
    """gRPC's final event, the OpenAI door's `ragserve` extension and MCP's answer result all carry
    why the server declined before the generator; an answer without one carries none."""
    import dataclasses

    from ragserve.events import DeclineEvidence
    from ragserve.server.mcp.results import answer_result
    from ragserve.server.openai.wire import Reply

    evidence = DeclineEvidence(0.93, 0.61, {"top_dense": 0.18, "found": 0.25})
    summary = FinalSummary(Usage(0, 0, 0), StageTimings(), Degraded(), "abstained", "gen", declined=True)
    declined = dataclasses.replace(summary, decline_evidence=evidence)
    final = query_event_pb(declined).final
    assert final.declined and final.HasField("decline_evidence")
    assert final.decline_evidence.score == pytest.approx(0.93)
    assert final.decline_evidence.threshold == pytest.approx(0.61)
    assert dict(final.decline_evidence.signals) == pytest.approx({"top_dense": 0.18, "found": 0.25})
    assert not query_event_pb(summary).final.HasField("decline_evidence")
    chunk = Reply("r1", "gen").chunks(declined)[0]
    assert chunk["ragserve"]["final"]["decline_evidence"]["signals"]["found"] == pytest.approx(0.25)
    content = answer_result([_result(), TokenDelta("The documents do not contain the answer."), declined])
    assert content.structured_content is not None
    assert content.structured_content["decline_evidence"]["score"] == pytest.approx(0.93)
