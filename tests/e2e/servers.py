"""Real `ragserve serve` processes for the end-to-end tests (loopback or a Unix socket; real MiniLM,
hnswlib index, vLLM engine): start, wait for SERVING, stop, and a few probes of a running one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import free_port

START_TIMEOUT_S = 300


@dataclass
class LiveServer:
    target: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def wait_serving(server: LiveServer, timeout_s: float = START_TIMEOUT_S, credentials: object = None) -> None:
    give_up = time.monotonic() + timeout_s
    metadata = (
        (("authorization", f"Bearer {server.env['RAGSERVE_AUTH_TOKEN']}"),)
        if "RAGSERVE_AUTH_TOKEN" in server.env
        else None
    )
    if credentials is None:
        channel = grpc.insecure_channel(server.target)
    else:
        channel = grpc.secure_channel(
            server.target, credentials, options=[("grpc.ssl_target_name_override", "localhost")]
        )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < give_up:
            if server.process.poll() is not None:
                pytest.fail(f"server exited with {server.process.returncode} during start-up:\n{server.log_tail()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0, metadata=metadata)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    pytest.fail(f"server not SERVING after {timeout_s} s:\n{server.log_tail()}")


def spawn_server(
    index: Path, log: Path, env: dict[str, str] | None = None, port: int | None = None, uds: str = ""
) -> LiveServer:
    """Start `ragserve serve` as a child process; the caller waits for SERVING and stops it."""
    metrics_port = free_port()
    full_env = {
        **os.environ,
        "RAGSERVE_LOG_LEVEL": "INFO",
        "RAGSERVE_SHUTDOWN_GRACE_S": "10",
        "RAGSERVE_METRICS_PORT": str(metrics_port),
        **(env or {}),
    }
    command = [sys.executable, "-m", "ragserve.cli", "serve", "--index", str(index)]
    if uds:
        command += ["--uds", uds]
        target = f"unix:{uds}"
    else:
        port = port or free_port()
        command += ["--port", str(port)]
        target = f"127.0.0.1:{port}"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=full_env)
    return LiveServer(target, process, log, env or {}, metrics_port)


# The shared full server: the real engine, a small in-flight bound (for the overload test) and
# client pings allowed every second (for the keepalive test).
LIVE_ENV = {
    "RAGSERVE_MAX_IN_FLIGHT": "4",
    "RAGSERVE_KEEPALIVE_MIN_PING_MS": "1000",
    "RAGSERVE_KEEPALIVE_TIME_MS": "2000",
    "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
}


def serving(index: Path, log: Path, env: dict[str, str]) -> Iterator[LiveServer]:
    """A fixture's body: a server until the fixture ends, which must then exit 0 on SIGTERM."""
    server = spawn_server(index, log, env)
    try:
        wait_serving(server)
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"server exited with {code} on SIGTERM:\n{server.log_tail()}"


def wait_engine_idle(stub: Any, limit_s: float) -> float:
    """Seconds until the engine holds no request, polling Info; fails past `limit_s`."""
    from ragserve.v1 import rag_pb2 as pb

    started = time.perf_counter()
    while True:
        info = stub.Info(pb.InfoRequest(), timeout=5)
        elapsed = time.perf_counter() - started
        if info.generator_unfinished_requests == 0:
            return elapsed
        if elapsed > limit_s:
            pytest.fail(f"engine still holds {info.generator_unfinished_requests} request(s) after {elapsed:.3f} s")
        time.sleep(0.01)


def cancel_mid_stream(stub: Any, question: str, after_tokens: int = 3) -> None:
    """Start a long Query, read `after_tokens` tokens, check the engine holds it, then cancel."""
    from ragserve.v1 import rag_pb2 as pb

    call = stub.Query(pb.QueryRequest(query=question, max_tokens=600, temperature=0.0), timeout=120)
    tokens = 0
    for event in call:
        tokens += event.WhichOneof("event") == "token"
        if tokens == after_tokens:
            break
    assert stub.Info(pb.InfoRequest(), timeout=5).generator_unfinished_requests == 1
    call.cancel()


@dataclass
class HttpProcess:
    """A vLLM OpenAI-compatible server or a vLLM router started by a test, on loopback, in a process
    group of its own: a vLLM server's engine-core and worker processes go with it (killed alone, the
    API process leaves them running, busy-polling the CPUs for the rest of the run)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """The server dies at once, all of it."""
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        self._signal_group(signal.SIGKILL)  # whatever of the group is left
        self.process.wait()


def _spawn_http(command: list[str], log: Path, env: dict[str, str] | None = None) -> HttpProcess:
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return HttpProcess(f"http://127.0.0.1:{port}", process, log)


def spawn_vllm_server(model: Path, log: Path, cpus: str, dtype: str) -> HttpProcess:
    """`python -m vllm.entrypoints.openai.api_server` with the flags ragserve needs (docs/remote.md),
    its OpenMP threads on `cpus`."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", dtype,
        "--block-size", "32", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "16",
    ]  # fmt: skip
    # Dev mode: POST /reset_prefix_cache, so a test can start from cold caches.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cpus, "VLLM_SERVER_DEV_MODE": "1"}
    return _spawn_http(command, log, env)


def reset_prefix_cache(server: HttpProcess) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(server.url + "/reset_prefix_cache", method="POST"), timeout=30):
        pass


def spawn_router(workers: list[str], policy: str, log: Path) -> HttpProcess:
    """vLLM's router (the `vllm-router` wheel) in front of `workers`."""
    metrics = ["--prometheus-port", str(free_port())]  # its default port is shared by every router
    return _spawn_http([router_command(), "--worker-urls", *workers, "--policy", policy, *metrics], log)


def router_command() -> str:
    """The router installed beside this Python (its venv's bin, on PATH or not)."""
    beside = Path(sys.executable).parent / "vllm-router"
    return str(beside) if beside.is_file() else "vllm-router"


def wait_http_ok(server: HttpProcess, path: str = "/health", timeout_s: float = START_TIMEOUT_S) -> None:
    import http.client
    import urllib.request

    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if server.process.poll() is not None:
            pytest.fail(f"{server.url} exited with {server.process.returncode} during start-up:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + path, timeout=2) as reply:
                if reply.status == 200:
                    return
        except http.client.HTTPException as error:
            pytest.fail(f"{server.url}: something else than an HTTP/1 server answers there ({error!r})")
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{server.url} not answering {path} after {timeout_s} s:\n{server.log_tail()}")


def running_requests(server: HttpProcess) -> float:
    """What the vLLM server's own metrics say it is running (vllm:num_requests_running)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:num_requests_running"
    )
