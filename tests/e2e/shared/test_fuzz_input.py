"""Property-based input test (promise 7): arbitrary field values never yield INTERNAL/UNKNOWN."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.e2e.servers import LiveServer

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
TEXT = st.one_of(
    st.text(max_size=50),
    st.text(
        alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF, exclude_categories=("Cs",)), max_size=300
    ),
    st.just(""),
    st.just("\x00"),
    st.builds(lambda n: "ω" * n, st.integers(min_value=1900, max_value=2100)),
    st.builds(lambda n: "a" * n, st.integers(min_value=0, max_value=20_000)),
)
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,  # Query on the retrieval-only server
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _code(call: object) -> grpc.StatusCode:
    try:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, pb.RetrieveResponse):
            list(result)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]


def test_retrieve_and_query_fields(retrieval_server: LiveServer) -> None:
    with grpc.insecure_channel(retrieval_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)

        @FUZZ
        @given(query=TEXT, top_k=INT32, budget_ms=INT32, max_tokens=INT32, temperature=FLOAT32)
        def check(query: str, top_k: int, budget_ms: int, max_tokens: int, temperature: float) -> None:
            retrieve = pb.RetrieveRequest(query=query, top_k=top_k, budget_ms=budget_ms)
            code = _code(lambda: stub.Retrieve(retrieve, timeout=10))
            assert code in ALLOWED, (code, retrieve)
            request = pb.QueryRequest(
                query=query, top_k=top_k, budget_ms=budget_ms, max_tokens=max_tokens, temperature=temperature
            )
            code = _code(lambda: stub.Query(request, timeout=10))
            assert code in ALLOWED, (code, request)

        check()
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_query_fields_on_the_full_server(live_server: LiveServer) -> None:
    """Fewer examples: valid ones generate, bounded by a short deadline."""
    with grpc.insecure_channel(live_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(query=TEXT, top_k=INT32, max_tokens=INT32, temperature=FLOAT32)
        def check(query: str, top_k: int, max_tokens: int, temperature: float) -> None:
            request = pb.QueryRequest(query=query, top_k=top_k, max_tokens=max_tokens, temperature=temperature)
            code = _code(lambda: stub.Query(request, timeout=1.5))
            assert code in ALLOWED, (code, request)

        check()
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
