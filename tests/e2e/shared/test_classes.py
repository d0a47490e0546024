"""Request classes on the real server and engine (vLLM priority scheduling on): batch is held to its
share of the in-flight slots and refused first, people are served beside it."""

from __future__ import annotations

import time

import grpc
import pytest

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc
from tests.e2e.servers import LiveServer


def test_batch_is_refused_past_its_share_while_people_are_served(live_server: LiveServer) -> None:
    # The shared server allows 4 calls in flight: batch may hold 2 (RAGSERVE_BATCH_MAX_SHARE 0.5).
    with grpc.insecure_channel(live_server.target) as channel:
        stub = rag_pb2_grpc.RagServiceStub(channel)
        batch = pb.REQUEST_CLASS_BATCH
        jobs = []
        for i in range(2):
            call = stub.Query(
                pb.QueryRequest(query=f"Explain the water cycle in detail ({i}).", max_tokens=400, request_class=batch),
                timeout=120,
            )
            next(call)  # the retrieval event: admitted and running
            jobs.append(call)
        try:
            with pytest.raises(grpc.RpcError) as refused:
                for _ in stub.Query(
                    pb.QueryRequest(query="One more job?", max_tokens=8, request_class=batch), timeout=30
                ):
                    pass
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(refused.value.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
            started = time.monotonic()
            events = list(stub.Query(pb.QueryRequest(query="Who discovered penicillin?", max_tokens=8), timeout=60))
            final = events[-1].final
            assert final.request_class == pb.REQUEST_CLASS_INTERACTIVE and final.finish_reason in ("stop", "length")
            assert time.monotonic() - started < 30
        finally:
            for call in jobs:
                call.cancel()
