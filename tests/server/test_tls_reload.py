"""TLS certificate rotation without a restart: new connections get the new certificate, and broken
new files (unreadable, not PEM, key and certificate not a pair) keep the current one.

An in-process grpc.aio server bound by the server's own `bind` (no models, no engine); the
certificate a connection sees is read from the TLS handshake itself.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ragserve.config import AccessSettings, Settings, TransportSettings
from ragserve.errors import ConfigError
from ragserve.server.app import bind
from ragserve.server.grpc import tls
from ragserve.server.grpc.tls import CertificateReloader
from ragserve.server.tls_files import TlsFiles
from tests.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki_a(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki-a"))


@pytest.fixture(scope="module")
def pki_b(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki-b"))


def _install(source: Path, target: Path) -> None:
    """As rotation tools do: write aside, then rename over the served file."""
    staging = target.with_suffix(".new")
    shutil.copyfile(source, staging)
    os.replace(staging, target)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _serving_files(folder: Path, pki: Pki) -> tuple[Path, Path]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    _install(pki.server_cert, cert)
    _install(pki.server_key, key)
    return cert, key


def _tls_files(folder: Path, pki: Pki) -> TlsFiles:
    cert, key = _serving_files(folder, pki)
    return TlsFiles(str(cert), str(key))


def _fingerprint_pem(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(serialization.Encoding.DER)


def _presented_certificate(uds_path: str) -> bytes:
    """The DER certificate the server presents to a new connection (not verified: only looked at)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(uds_path)
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


async def _health_over_tls(uds_path: str, ca: bytes) -> int:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    # Over a Unix socket the default authority is the path: name the certificate's host.
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(f"unix:{uds_path}", credentials, options=options) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return int(reply.status)


def test_new_connections_get_the_rotated_certificate_and_broken_files_keep_it(
    tmp_path: Path, pki_a: Pki, pki_b: Pki
) -> None:
    cert, key = _serving_files(tmp_path, pki_a)
    uds_path = str(tmp_path / "s.sock")
    settings = Settings(
        transport=TransportSettings(uds_path=uds_path),
        access=AccessSettings(tls_cert_file=str(cert), tls_key_file=str(key)),
    )
    ca_a, ca_b = pki_a.ca_cert.read_bytes(), pki_b.ca_cert.read_bytes()

    async def run() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        bind(server, settings)
        await server.start()
        gc.collect()  # the server alone must keep the certificate fetcher alive
        presented = lambda: asyncio.to_thread(_presented_certificate, uds_path)  # noqa: E731
        try:
            assert await presented() == _fingerprint_pem(pki_a.server_cert)
            assert await _health_over_tls(uds_path, ca_a) == health_pb2.HealthCheckResponse.SERVING

            _install(pki_b.server_cert, cert)
            _install(pki_b.server_key, key)
            assert await presented() == _fingerprint_pem(pki_b.server_cert)
            assert await _health_over_tls(uds_path, ca_b) == health_pb2.HealthCheckResponse.SERVING

            # Half a rotation: A's key beside B's certificate is not a pair. B stays.
            _install(pki_a.server_key, key)
            assert await presented() == _fingerprint_pem(pki_b.server_cert)
            # Not a certificate at all.
            _write(cert, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
            assert await presented() == _fingerprint_pem(pki_b.server_cert)
            # Gone (a Secret mid-update).
            os.unlink(cert)
            assert await presented() == _fingerprint_pem(pki_b.server_cert)
            assert await _health_over_tls(uds_path, ca_b) == health_pb2.HealthCheckResponse.SERVING

            # A complete pair again is taken at once.
            _install(pki_a.server_cert, cert)
            assert await presented() == _fingerprint_pem(pki_a.server_cert)
        finally:
            await server.stop(None)

    asyncio.run(run())


def test_unchanged_files_are_only_stated_not_read(tmp_path: Path, pki_a: Pki, monkeypatch) -> None:
    reloader = CertificateReloader(_tls_files(tmp_path, pki_a))
    loads: list[TlsFiles] = []
    real_load = tls.load_certificate_configuration
    monkeypatch.setattr(tls, "load_certificate_configuration", lambda files: loads.append(files) or real_load(files))
    assert all(reloader.fetch() is None for _ in range(1000))
    assert loads == []


def test_a_broken_rotation_is_logged_once_and_a_good_one_is_taken(
    tmp_path: Path, pki_a: Pki, pki_b: Pki, caplog
) -> None:
    files = _tls_files(tmp_path, pki_a)
    reloader = CertificateReloader(files)
    _install(pki_b.server_cert, Path(files.cert_file))  # the key is still A's
    with caplog.at_level(logging.WARNING, logger="ragserve.server.grpc.tls"):
        assert [reloader.fetch() for _ in range(5)] == [None] * 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not match" in warnings[0]

    _install(pki_b.server_key, Path(files.key_file))
    assert isinstance(reloader.fetch(), grpc.ServerCertificateConfiguration)
    assert reloader.fetch() is None  # handed over once


def test_a_client_ca_that_changes_is_reloaded_too(tmp_path: Path, pki_a: Pki, pki_b: Pki) -> None:
    ca = tmp_path / "client-ca.pem"
    _install(pki_a.ca_cert, ca)
    files = _tls_files(tmp_path, pki_a)
    reloader = CertificateReloader(TlsFiles(files.cert_file, files.key_file, str(ca)))
    _install(pki_b.ca_cert, ca)
    assert reloader.fetch() is not None


@pytest.mark.parametrize("problem", ["mismatch", "garbage", "missing"])
def test_a_bad_pair_at_start_up_is_a_clear_config_error(tmp_path: Path, pki_a: Pki, pki_b: Pki, problem: str) -> None:
    files = _tls_files(tmp_path, pki_a)
    if problem == "mismatch":
        _install(pki_b.server_key, Path(files.key_file))
    elif problem == "garbage":
        Path(files.key_file).write_text("not a key")
    else:
        Path(files.cert_file).unlink()
    with pytest.raises(ConfigError, match="TLS"):
        CertificateReloader(files)
