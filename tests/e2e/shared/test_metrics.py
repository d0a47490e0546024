"""/metrics after real requests: every series is there with plausible values."""

from __future__ import annotations

import contextlib
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.e2e.servers import LiveServer


def _scrape(server: LiveServer) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def _value(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    wanted = tuple(sorted(labels.items()))
    series = samples.get(name, {})
    assert wanted in series, f"{name}{labels} missing; have {sorted(series)[:8]}"
    return series[wanted]


def test_metrics_cover_every_stage(live_server: LiveServer) -> None:
    with grpc.insecure_channel(live_server.target) as channel:
        stub = pb_grpc.RagServiceStub(channel)
        stub.Retrieve(pb.RetrieveRequest(query="What is Raft consensus?"), timeout=10)
        stub.Retrieve(pb.RetrieveRequest(query="What is Raft consensus?"), timeout=10)  # a cache hit
        # A query no other test sends (so not a cache hit) with a budget nobody can meet.
        stub.Retrieve(pb.RetrieveRequest(query="How does Raft elect a leader, in brief?", budget_ms=1), timeout=10)
        events = list(stub.Query(pb.QueryRequest(query="What is Raft consensus?", max_tokens=12), timeout=120))
        assert events[-1].WhichOneof("event") == "final"
        with contextlib.suppress(grpc.RpcError):  # counted as INVALID_ARGUMENT below
            stub.Retrieve(pb.RetrieveRequest(query=""), timeout=10)
    samples = _scrape(live_server)

    for stage in (
        "embed",
        "search",
        "retrieval",
        "prompt",
        "ttft",
        "time_per_output_token",
        "generation",
        "query_total",
        "retrieve_end_to_end",
        "query_end_to_end",
    ):
        count = _value(samples, "ragserve_stage_latency_ms_count", stage=stage)
        total = _value(samples, "ragserve_stage_latency_ms_sum", stage=stage)
        assert count >= 1, stage
        assert 0 < total / count < 60_000, (stage, total / count)
    # Plausibility: TTFT includes retrieval; a token takes longer than a vector search.
    ttft = _value(samples, "ragserve_stage_latency_ms_sum", stage="ttft") / _value(
        samples, "ragserve_stage_latency_ms_count", stage="ttft"
    )
    assert ttft > 10

    assert _value(samples, "ragserve_requests_total", method="Retrieve", code="OK") >= 2
    assert _value(samples, "ragserve_requests_total", method="Query", code="OK") >= 1
    assert _value(samples, "ragserve_requests_total", method="Retrieve", code="INVALID_ARGUMENT") >= 1
    assert _value(samples, "ragserve_degraded_total", kind="budget_exhausted") >= 1
    assert _value(samples, "ragserve_in_flight_requests") == 0
    prompt = _value(samples, "ragserve_prompt_tokens_total")
    cached = _value(samples, "ragserve_prefix_cache_hit_tokens_total")
    assert 0 < cached < prompt
    assert _value(samples, "ragserve_completion_tokens_total") >= 1
    # The default in-process cache: the repeated Retrieve above was a hit.
    assert _value(samples, "ragserve_cache_requests_total", backend="memory", result="hit") >= 1
    assert _value(samples, "ragserve_cache_requests_total", backend="memory", result="miss") >= 1
    cache_count = _value(samples, "ragserve_stage_latency_ms_count", stage="cache")
    assert cache_count >= 1 and _value(samples, "ragserve_stage_latency_ms_sum", stage="cache") / cache_count < 50
    # No reranking by default (auto, and the sample version ships no tuned cross-encoder): the depth
    # series exist and are empty.
    for tier in ("tier1", "tier2"):
        assert _value(samples, "ragserve_rerank_depth_count", tier=tier) == 0


def test_a_server_start_is_quiet_on_the_terminal(live_server: LiveServer) -> None:
    """Default level: our own lines and third-party warnings an operator can act on, one format,
    one stream; no per-weight dtype lines, no engine config dump, no progress bar."""
    text = live_server.log_text()
    start = text[: text.index("serving on")].splitlines()
    assert len(start) <= 25, "\n".join(start)
    assert "Attempted to load weight" not in text and "with config:" not in text
    assert "Loading safetensors checkpoint shards" not in text
    assert "vllm_process_name" not in text
