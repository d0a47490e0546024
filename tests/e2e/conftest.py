"""A real server process on loopback: real MiniLM, real hnswlib index, real vLLM engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    target: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_serving(server: LiveServer, timeout_s: float) -> None:
    give_up = time.monotonic() + timeout_s
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < give_up:
            if server.process.poll() is not None:
                pytest.fail(f"server exited with {server.process.returncode} during start-up:\n{server.log_tail()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    pytest.fail(f"server not SERVING after {timeout_s} s:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def live_server(sample_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "RAGSERVE_LOG_LEVEL": "INFO", "RAGSERVE_SHUTDOWN_GRACE_S": "5"}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragserve.cli", "serve", "--port", str(port), "--index", str(sample_index)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = LiveServer(f"127.0.0.1:{port}", process, log)
    try:
        wait_serving(server, START_TIMEOUT_S)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, f"server exited with {process.returncode} on SIGTERM:\n{server.log_tail()}"
