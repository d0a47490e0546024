"""Access control (promise 8): loopback or a 0600 Unix socket by default; anything else needs TLS or a token."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.certs import Pki, make_pki
from tests.e2e.servers import LiveServer, spawn_server, wait_serving
from tests.helpers import free_port

RETRIEVAL_ONLY = {"RAGSERVE_GENERATION_ENABLED": "false"}
TOKEN = "s3cret-token-that-must-never-be-logged"


@pytest.fixture(scope="module")
def access_servers(
    sample_index: Path, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[dict[str, LiveServer]]:
    """This module's four retrieval-only servers, started at once on first use (their start-ups
    overlap); each test waits for its own. All must exit 0 on SIGTERM."""
    folder = tmp_path_factory.mktemp("access")
    envs = {
        "uds": RETRIEVAL_ONLY,
        "token": {**RETRIEVAL_ONLY, "RAGSERVE_AUTH_TOKEN": TOKEN},
        "mtls": _mtls_env(pki, "another app, ragserve test client"),
        # mTLS that admits only a certificate named "another app": the test client's CA-signed one is not.
        "pinned": _mtls_env(pki, "another app"),
    }
    started = {
        name: spawn_server(
            sample_index, folder / f"{name}.log", env, uds=str(folder / "ragserve.sock") if name == "uds" else ""
        )
        for name, env in envs.items()
    }
    try:
        yield started
    finally:
        with ThreadPoolExecutor(len(started)) as pool:
            codes = dict(zip(started, pool.map(LiveServer.stop, started.values()), strict=True))
    assert all(code == 0 for code in codes.values()), {
        name: started[name].log_tail() for name in started if codes[name]
    }


@pytest.fixture(scope="module")
def uds_server(access_servers: dict[str, LiveServer]) -> LiveServer:
    wait_serving(access_servers["uds"])
    return access_servers["uds"]


def test_unix_socket_is_private_to_its_user(uds_server: LiveServer) -> None:
    path = uds_server.target.removeprefix("unix:")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with grpc.insecure_channel(uds_server.target) as channel:
        assert pb_grpc.RagServiceStub(channel).Retrieve(pb.RetrieveRequest(query="TLS"), timeout=5).passages


def test_non_loopback_address_is_refused_without_protection(sample_index: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **RETRIEVAL_ONLY, "RAGSERVE_INDEX_PATH": str(sample_index), "RAGSERVE_METRICS_PORT": "0"},
    )
    assert result.returncode == 2
    assert "RAGSERVE_ALLOW_NON_LOOPBACK" in result.stderr
    assert "Traceback" not in result.stderr


def test_opt_in_without_tls_or_token_is_still_refused(sample_index: Path) -> None:
    env = {**os.environ, **RETRIEVAL_ONLY, "RAGSERVE_ALLOW_NON_LOOPBACK": "true", "RAGSERVE_METRICS_PORT": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "serve", "--host", "0.0.0.0", "--index", str(sample_index)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "TLS" in result.stderr and "RAGSERVE_AUTH_TOKEN" in result.stderr


@pytest.fixture(scope="module")
def token_server(access_servers: dict[str, LiveServer]) -> LiveServer:
    wait_serving(access_servers["token"])
    return access_servers["token"]


@pytest.mark.parametrize("presented", [None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN])
def test_every_method_needs_the_token(token_server: LiveServer, presented: str | None) -> None:
    metadata = (("authorization", presented),) if presented else None
    with grpc.insecure_channel(token_server.target) as channel:
        calls = [
            lambda: pb_grpc.RagServiceStub(channel).Retrieve(
                pb.RetrieveRequest(query="x"), timeout=5, metadata=metadata
            ),
            lambda: pb_grpc.RagServiceStub(channel).Info(pb.InfoRequest(), timeout=5, metadata=metadata),
            lambda: list(
                pb_grpc.RagServiceStub(channel).Query(pb.QueryRequest(query="x"), timeout=5, metadata=metadata)
            ),
            lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5, metadata=metadata
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_reflection_needs_the_token_too(token_server: LiveServer) -> None:
    grpcurl = shutil.which("grpcurl")
    assert grpcurl, "grpcurl is not installed"
    denied = subprocess.run([grpcurl, "-plaintext", token_server.target, "list"], capture_output=True, text=True)
    assert denied.returncode != 0 and "Unauthenticated" in denied.stderr
    allowed = subprocess.run(
        [grpcurl, "-plaintext", "-H", f"authorization: Bearer {TOKEN}", token_server.target, "list"],
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0, allowed.stderr
    assert "ragserve.v1.RagService" in allowed.stdout


def test_right_token_is_accepted_and_never_logged(token_server: LiveServer) -> None:
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(token_server.target) as channel:
        reply = pb_grpc.RagServiceStub(channel).Retrieve(pb.RetrieveRequest(query="Raft"), timeout=5, metadata=metadata)
    assert reply.passages
    assert TOKEN not in token_server.log_text()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _mtls_env(pki: Pki, allowed_client_ids: str) -> dict[str, str]:
    return {
        **RETRIEVAL_ONLY,
        "RAGSERVE_TLS_CERT_FILE": str(pki.server_cert),
        "RAGSERVE_TLS_KEY_FILE": str(pki.server_key),
        "RAGSERVE_TLS_CLIENT_CA_FILE": str(pki.ca_cert),
        "RAGSERVE_TLS_ALLOWED_CLIENT_IDS": allowed_client_ids,
    }


@pytest.fixture(scope="module")
def mtls_server(access_servers: dict[str, LiveServer], pki: Pki) -> LiveServer:
    wait_serving(access_servers["mtls"], credentials=_client_credentials(pki, with_client_cert=True))
    return access_servers["mtls"]


def _client_credentials(pki: Pki, with_client_cert: bool) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca_cert.read_bytes(),
        private_key=pki.client_key.read_bytes() if with_client_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if with_client_cert else None,
    )


def _retrieve(target: str, credentials: grpc.ChannelCredentials | None) -> pb.RetrieveResponse:
    if credentials is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "localhost")])
    with channel:
        return pb_grpc.RagServiceStub(channel).Retrieve(pb.RetrieveRequest(query="HTTP/2"), timeout=5)


def test_mtls_accepts_a_client_certificate(mtls_server: LiveServer, pki: Pki) -> None:
    assert _retrieve(mtls_server.target, _client_credentials(pki, with_client_cert=True)).passages


@pytest.mark.parametrize("mode", ["plaintext", "tls-without-client-cert"])
def test_mtls_refuses_other_clients(mtls_server: LiveServer, pki: Pki, mode: str) -> None:
    credentials = None if mode == "plaintext" else _client_credentials(pki, with_client_cert=False)
    with pytest.raises(grpc.RpcError) as info:
        _retrieve(mtls_server.target, credentials)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def pinned_server(access_servers: dict[str, LiveServer]) -> LiveServer:
    server = access_servers["pinned"]
    # Health is pinned too, so readiness is read from the log.
    give_up = time.monotonic() + 300
    while "serving on" not in server.log_text():
        assert server.process.poll() is None and time.monotonic() < give_up, server.log_tail()
        time.sleep(0.2)
    return server


def test_mtls_pinning_refuses_a_certificate_of_another_name(pinned_server: LiveServer, pki: Pki) -> None:
    credentials = _client_credentials(pki, with_client_cert=True)
    with pytest.raises(grpc.RpcError) as info:
        _retrieve(pinned_server.target, credentials)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    options = [("grpc.ssl_target_name_override", "localhost")]
    with (
        grpc.secure_channel(pinned_server.target, credentials, options=options) as channel,
        pytest.raises(grpc.RpcError) as health_info,
    ):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health_info.value.code() == grpc.StatusCode.PERMISSION_DENIED
