"""Tracing: the request span continues the caller's trace from gRPC metadata; stages are children."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ragserve import tracing
from ragserve.config import AnswerSettings, IndexSettings, Settings
from ragserve.factory import make_pipeline
from ragserve.server.app import make_front
from ragserve.server.grpc.servicer import RagServicer
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def test_retrieve_spans_continue_the_callers_trace(sample_index: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing.setup_tracing(exporter=exporter)
    settings = Settings(index=IndexSettings(path=sample_index), answer=AnswerSettings(generation_enabled=False))
    pipeline = make_pipeline(settings, with_generator=False)

    async def run() -> None:
        server = grpc.aio.server()
        pb_grpc.add_RagServiceServicer_to_server(RagServicer(make_front(settings, pipeline)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await pb_grpc.RagServiceStub(channel).Retrieve(
                    pb.RetrieveRequest(query="What is a Bloom filter?"),
                    metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"),),
                    timeout=30,
                )
        finally:
            await server.stop(None)

    try:
        asyncio.run(run())
    finally:
        tracing._tracer = None  # later tests run untraced
    spans = {span.name: span for span in exporter.get_finished_spans()}
    root = spans["ragserve.v1.RagService/Retrieve"]
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_SPAN_ID
    for stage in ("embed", "search"):
        assert spans[stage].parent is not None and spans[stage].parent.span_id == root.context.span_id
        assert spans[stage].end_time > spans[stage].start_time
