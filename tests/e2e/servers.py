"""Real `ragserve serve` processes for the end-to-end tests (loopback or a Unix socket; real MiniLM,
hnswlib index, vLLM engine): start, wait for SERVING, stop, and a few probes of a running one."""

from __future__ import annotations

import asyncio
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

# The vLLM server and router helpers live with the benchmarks, which start them too.
from benchmarks.workloads import START_TIMEOUT_S, HttpProcess
from tests.helpers import free_port


@dataclass
class LiveServer:
    target: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0

    @property
    def openai_url(self) -> str:
        """The OpenAI-compatible door's base URL (a server started with RAGSERVE_OPENAI_PORT)."""
        return f"http://127.0.0.1:{self.env['RAGSERVE_OPENAI_PORT']}/v1"

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
        # Tests ask about passages they choose: background warming of the whole corpus would make
        # their caches and their CPU depend on its timing. tests/e2e/shared/test_warm.py turns it on.
        "RAGSERVE_WARM_WHOLE_CORPUS": "false",
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


# The base model, without the shipped adapter: the stream, deadline, cancellation and overload
# tests need answers that run long, and the adapter answers in a few tokens or declines. The
# adapter's own serving is tested by test_generator_contract and test_document_access.
BASE_MODEL_ENV = {"RAGSERVE_GENERATOR_ADAPTER": "none"}

# The shared full server: the real engine, a small in-flight bound (for the overload test) and
# client pings allowed every second (for the keepalive test).
LIVE_ENV = {
    **BASE_MODEL_ENV,
    "RAGSERVE_MAX_IN_FLIGHT": "4",
    "RAGSERVE_KEEPALIVE_MIN_PING_MS": "1000",
    "RAGSERVE_KEEPALIVE_TIME_MS": "2000",
    "RAGSERVE_HEALTH_PROBE_INTERVAL_S": "0.5",
    # The reader always gets its passage, however loaded the test machine was when it measured its
    # cost: the stream tests check its span.
    "RAGSERVE_READER_BUDGET_MS": "2000",
}


# A full server that decodes in float32, speculates (n-gram, the engine on a server thread) and
# keeps no answer cache: greedy answers are then token-exact between engines (test_speculation
# compares it with plain decoding, test_remote with vLLM servers). One server serves both modules.
FLOAT32_ENV = {
    **BASE_MODEL_ENV,
    "RAGSERVE_GENERATOR_SPECULATIVE": "ngram",
    "RAGSERVE_CACHE_ANSWERS": "false",
    "RAGSERVE_GENERATOR_DTYPE": "float32",
}


class SessionServers:
    """Servers a folder's modules share for the whole session. They start together on first use of
    any (their start-ups overlap: on two cores, two start-ups at once take about as long as the
    longer one), and every one must exit 0 on SIGTERM at the end."""

    def __init__(
        self, index: Path, folder: Path, envs: dict[str, dict[str, str]], wanted: set[str] | None = None
    ) -> None:
        self._index = index
        self._folder = folder
        self._envs = envs
        # The servers this run's tests take (None: all): the others start with one only when
        # wanted, so a run of one module starts only the servers it takes.
        self._wanted = wanted
        self._started: dict[str, LiveServer] = {}
        self._ready: set[str] = set()

    def get(self, name: str) -> LiveServer:
        if name not in self._started:
            for member, env in self._envs.items():
                if member not in self._started and (member == name or self._wanted is None or member in self._wanted):
                    self._started[member] = spawn_server(self._index, self._folder / f"{member}.log", env)
        server = self._started[name]
        if name not in self._ready:
            wait_serving(server)
            self._ready.add(name)
        return server

    def stop_all(self) -> None:
        """Every server drains at once; each must exit 0 on SIGTERM."""
        codes = self._exit_codes()
        assert all(code == 0 for code in codes.values()), f"a shared server exited badly on SIGTERM: {codes}"

    def _exit_codes(self) -> dict[str, int]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, len(self._started))) as pool:
            return dict(zip(self._started, pool.map(LiveServer.stop, self._started.values()), strict=True))


def serving(index: Path, log: Path, env: dict[str, str], credentials: object = None) -> Iterator[LiveServer]:
    """A fixture's body: a server until the fixture ends, which must then exit 0 on SIGTERM."""
    server = spawn_server(index, log, env)
    try:
        wait_serving(server, credentials=credentials)
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


def wait_warm(target: str, limit_s: float = 120.0, credentials: Any = None) -> Any:
    """Info's warming state once warming has finished (it runs after SERVING, in the background).
    `credentials`: TLS channel credentials, for a server that asks for them."""
    from ragserve.client import RagClient
    from ragserve.v1 import rag_pb2 as pb
    from ragserve.v1 import rag_pb2_grpc as pb_grpc

    async def info() -> Any:
        if credentials is not None:
            options = [("grpc.ssl_target_name_override", "localhost")]
            with grpc.secure_channel(target, credentials, options=options) as channel:
                return pb_grpc.RagServiceStub(channel).Info(pb.InfoRequest(), timeout=10)
        async with RagClient(target) as client:
            return await client.info()

    give_up = time.monotonic() + limit_s
    while time.monotonic() < give_up:
        warming = asyncio.run(info()).warming
        if warming.done:
            return warming
        time.sleep(0.2)
    raise AssertionError(f"warming did not finish within {limit_s:g} s")


def template_tokens() -> int:
    """Prompt tokens every request shares: the rendered prompt's common prefix for two questions."""
    from transformers import AutoTokenizer

    from ragserve.config import default_generator_path
    from ragserve.prompt import SYSTEM_PREFIX

    tokenizer = AutoTokenizer.from_pretrained(str(default_generator_path()))

    def ids(user: str) -> list[int]:
        messages = [{"role": "system", "content": SYSTEM_PREFIX}, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    a, b = ids("first"), ids("second")
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
