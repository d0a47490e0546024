"""Clients with auth on: RagClient and `ragserve health` send the bearer token and speak TLS/mTLS.

In-process grpc.aio servers with the server's own BearerTokenInterceptor and a fake servicer
(FakeRagService); certificates from a throwaway CA.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner, Result

from ragserve.cli import app as cli
from ragserve.client import ClientSettings, RagClient, is_local_target
from ragserve.config import AccessSettings
from ragserve.errors import ConfigError
from ragserve.server.app import RETRIEVE_HEALTH_NAME
from ragserve.server.grpc.auth import BearerTokenInterceptor
from ragserve.server.identity import Identity
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.certs import Pki, make_pki
from tests.fakes import FakeRagService

REPO = Path(__file__).resolve().parent.parent
TOKEN = "s3cret-token"
# The server certificate names only this host: clients must be told it (tls_server_name).
SERVER_NAME = "ragserve.internal"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), server_name=SERVER_NAME)


@pytest.fixture(autouse=True)
def no_client_env(monkeypatch) -> None:
    for name in ("RAGSERVE_AUTH_TOKEN", "RAGSERVE_CLIENT_AUTH_TOKEN", "RAGSERVE_CLIENT_TLS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


@asynccontextmanager
async def protected_server(address: str, pki: Pki | None) -> AsyncIterator[str]:
    """Token always; with `pki`, TLS that requires a client certificate (mTLS). Yields the target."""
    server = grpc.aio.server(interceptors=[BearerTokenInterceptor(Identity(AccessSettings(auth_token=TOKEN)))])
    pb_grpc.add_RagServiceServicer_to_server(FakeRagService(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(RETRIEVE_HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING)
    if pki is None:
        port = server.add_insecure_port(address)
    else:
        credentials = grpc.ssl_server_credentials(
            [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
            root_certificates=pki.ca_cert.read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port(address, credentials)
    await server.start()
    try:
        yield address if address.startswith("unix:") else f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _mtls(pki: Pki, **extra: str) -> ClientSettings:
    return ClientSettings(
        tls_ca_file=str(pki.ca_cert),
        tls_cert_file=str(pki.client_cert),
        tls_key_file=str(pki.client_key),
        tls_server_name=SERVER_NAME,
        **extra,  # type: ignore[arg-type]
    )


def test_rag_client_sends_the_token_over_mtls(pki: Pki) -> None:
    async def run() -> None:
        async with protected_server("127.0.0.1:0", pki) as target:
            async with RagClient(target, access=_mtls(pki, auth_token=TOKEN)) as client:
                assert (await client.retrieve("q")).passages[0].text == "q"
            async with RagClient(target, access=_mtls(pki)) as client:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await client.retrieve("q")
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    asyncio.run(run())


def test_rag_client_reads_the_token_and_tls_files_from_the_environment(pki: Pki, monkeypatch) -> None:
    monkeypatch.setenv("RAGSERVE_AUTH_TOKEN", TOKEN)  # the server's own name: one secret for both
    monkeypatch.setenv("RAGSERVE_CLIENT_TLS_CA_FILE", str(pki.ca_cert))
    monkeypatch.setenv("RAGSERVE_CLIENT_TLS_CERT_FILE", str(pki.client_cert))
    monkeypatch.setenv("RAGSERVE_CLIENT_TLS_KEY_FILE", str(pki.client_key))
    monkeypatch.setenv("RAGSERVE_CLIENT_TLS_SERVER_NAME", SERVER_NAME)

    async def run() -> None:
        async with protected_server("127.0.0.1:0", pki) as target, RagClient(target) as client:
            assert (await client.retrieve("q")).passages

    asyncio.run(run())


def test_without_the_server_name_the_certificate_is_refused(pki: Pki) -> None:
    async def run() -> grpc.StatusCode:
        access = ClientSettings(
            auth_token=TOKEN,
            tls_ca_file=str(pki.ca_cert),
            tls_cert_file=str(pki.client_cert),
            tls_key_file=str(pki.client_key),
        )
        async with protected_server("127.0.0.1:0", pki) as target, RagClient(target, 5, access) as client:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.retrieve("q")
        return info.value.code()

    assert asyncio.run(run()) == grpc.StatusCode.UNAVAILABLE


def test_a_token_never_crosses_a_network_in_plaintext() -> None:
    with pytest.raises(ConfigError, match="only over TLS"):
        RagClient("10.1.2.3:50051", access=ClientSettings(auth_token=TOKEN))
    assert is_local_target("unix:/run/ragserve.sock") and is_local_target("[::1]:50051")
    assert not is_local_target("dns:///ragserve.example:443")


def test_a_client_certificate_without_its_key_is_a_clear_error(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="needs its key"):
        RagClient("127.0.0.1:1", access=ClientSettings(tls_cert_file=str(pki.client_cert)))


def _health(args: list[str], env: dict[str, str] | None = None) -> Callable[[], Result]:
    return lambda: CliRunner().invoke(cli, ["health", *args], env=env)


def _sidecar_probe_args(sock: Path) -> list[str]:
    """The Kubernetes manifest's readiness probe command, pointed at `sock`."""
    documents = yaml.safe_load_all((REPO / "deploy" / "k8s" / "ragserve-sidecar.yaml").read_text())
    manifest = next(d for d in documents if d["kind"] == "Deployment")
    sidecar = manifest["spec"]["template"]["spec"]["initContainers"][0]
    socket_path = next(e["value"] for e in sidecar["env"] if e["name"] == "RAGSERVE_UDS_PATH")
    command = sidecar["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["ragserve", "health"]
    return [str(sock) if arg == socket_path else arg for arg in command[2:]]


def test_sidecar_probe_over_the_unix_socket_passes_the_servers_token(tmp_path: Path) -> None:
    """The sidecar's probes run in the server's container: RAGSERVE_AUTH_TOKEN is already there."""
    sock = tmp_path / "rag.sock"
    args = _sidecar_probe_args(sock)

    async def run() -> tuple[Result, Result]:
        async with protected_server(f"unix:{sock}", None):
            with_env = await asyncio.to_thread(_health(args, {"RAGSERVE_AUTH_TOKEN": TOKEN}))
            without = await asyncio.to_thread(_health(args))
        return with_env, without

    with_env, without = asyncio.run(run())
    assert with_env.exit_code == 0 and with_env.output.strip() == "SERVING", with_env.output
    assert without.exit_code == 1 and "UNAUTHENTICATED" in without.output
    # One line that names the fix.
    assert len(without.output.strip().splitlines()) == 1 and "RAGSERVE_CLIENT_AUTH_TOKEN" in without.output


def test_health_asks_for_the_named_service(tmp_path: Path) -> None:
    """`--service` asks for one health name: retrieval's stays SERVING while the whole service is
    NOT_SERVING (a generator outage), and a name the server does not know is said plainly."""
    sock = tmp_path / "rag.sock"

    async def run() -> tuple[Result, Result, Result]:
        server = grpc.aio.server()
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await health_servicer.set(RETRIEVE_HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING)
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        try:
            overall = await asyncio.to_thread(_health(["--uds", str(sock)]))
            retrieval = await asyncio.to_thread(_health(["--uds", str(sock), "--service", RETRIEVE_HEALTH_NAME]))
            unknown = await asyncio.to_thread(_health(["--uds", str(sock), "--service", "no.such/Name"]))
        finally:
            await server.stop(None)
        return overall, retrieval, unknown

    overall, retrieval, unknown = asyncio.run(run())
    assert overall.exit_code == 1 and overall.output.strip() == "NOT_SERVING", overall.output
    assert retrieval.exit_code == 0 and retrieval.output.strip() == "SERVING", retrieval.output
    assert unknown.exit_code == 1 and "no health status named 'no.such/Name'" in unknown.output


def test_the_health_help_names_the_servers_retrieval_health_name() -> None:
    result = CliRunner().invoke(cli, ["health", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert RETRIEVE_HEALTH_NAME in " ".join(result.output.split()), result.output


def test_health_wait_stops_at_once_when_the_token_is_refused(tmp_path: Path) -> None:
    import time

    sock = tmp_path / "rag.sock"

    async def run() -> tuple[Result, float]:
        async with protected_server(f"unix:{sock}", None):
            started = time.monotonic()
            refused = await asyncio.to_thread(
                _health(["--uds", str(sock), "--wait", "60"], {"RAGSERVE_AUTH_TOKEN": ""})
            )
            return refused, time.monotonic() - started

    refused, seconds = asyncio.run(run())
    assert refused.exit_code == 1 and "RAGSERVE_CLIENT_AUTH_TOKEN" in refused.output
    assert seconds < 10, f"kept retrying refused credentials for {seconds:.1f} s"


@pytest.mark.parametrize("command", [["health"], ["ask", "why?"], ["retrieve", "why?"]])
def test_nothing_listening_says_to_start_the_server(command: list[str]) -> None:
    from tests.helpers import free_port

    port = str(free_port())
    result = CliRunner().invoke(cli, [*command, "--port", port])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "is `ragserve serve` running" in lines[0] and port in lines[0]


def test_health_probe_over_mtls_with_a_token_file(pki: Pki, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")

    async def run() -> Result:
        async with protected_server("127.0.0.1:0", pki) as target:
            port = target.rsplit(":", 1)[1]
            args = [
                *("--port", port, "--token-file", str(token_file)),
                *("--tls-ca-file", str(pki.ca_cert), "--tls-server-name", SERVER_NAME),
                *("--tls-cert-file", str(pki.client_cert), "--tls-key-file", str(pki.client_key)),
            ]
            return await asyncio.to_thread(_health(args))

    result = asyncio.run(run())
    assert result.exit_code == 0 and result.output.strip() == "SERVING", result.output


def test_health_reports_an_unreadable_tls_file_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["health", "--tls-ca-file", str(tmp_path / "missing.pem")])
    assert result.exit_code == 2 and "cannot read the client's TLS CA file" in result.output


class _FakeWarmingService(pb_grpc.RagServiceServicer):
    """A fake server whose warming finishes after `polls` Info calls (never, when negative)."""

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.calls = 0

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        self.calls += 1
        done = 0 <= self.polls < self.calls
        warming = pb.Warming(passages=12 if done else 3, tokens=1800 if done else 450, done=done, seconds=2.5 * done)
        return pb.InfoResponse(warming=warming)


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_health_warm_waits_until_warming_has_finished(tmp_path: Path) -> None:
    """`--warm`: SERVING, then Info until warming is done (a rollout routes traffic once warm); past
    --wait it says how far warming got and exits 1."""
    sock = tmp_path / "rag.sock"

    async def run(service: _FakeWarmingService, wait: str) -> Result:
        server = grpc.aio.server()
        pb_grpc.add_RagServiceServicer_to_server(service, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        try:
            return await asyncio.to_thread(_health(["--uds", str(sock), "--warm", "--wait", wait]))
        finally:
            await server.stop(None)

    finishing = _FakeWarmingService(polls=2)
    warmed = asyncio.run(run(finishing, "30"))
    assert warmed.exit_code == 0, warmed.output
    assert warmed.output.splitlines() == ["SERVING", "warm: 12 passages (1800 tokens) in 2.5 s, 0 left cold"]
    assert finishing.calls == 3
    still = asyncio.run(run(_FakeWarmingService(polls=-1), "1"))
    assert still.exit_code == 1 and "still warming: 3 passages (450 tokens) so far" in still.output, still.output
