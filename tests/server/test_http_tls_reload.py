"""The HTTP doors' TLS follows certificate rotation without a restart, as the gRPC port does: new
connections get a rotated certificate, and a broken new file keeps the current one."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ragserve.config import Settings
from ragserve.server.app import make_front
from ragserve.server.http import listener as http_listener
from tests.certs import Pki, make_pki
from tests.helpers import free_port
from tests.server.test_openai_door import openai_app, serving


def _served(port: int) -> bytes:
    """The certificate a new connection is shown (DER)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pki: Pki) -> bytes:
    return x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).public_bytes(serialization.Encoding.DER)


def test_a_rotated_certificate_is_served_to_new_connections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_listener, "TLS_CHECK_S", 0.1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = make_pki(tmp_path / "a"), make_pki(tmp_path / "b")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(first.server_cert, cert)
    shutil.copy(first.server_key, key)
    settings = Settings(
        http={"port": free_port()}, access={"tls_cert_file": str(cert), "tls_key_file": str(key), "auth_token": "t"}
    )
    with serving(settings, openai_app(settings, make_front(settings))):
        port = settings.http.port
        assert _served(port) == _der(first)
        shutil.copy(second.server_key, key)
        shutil.copy(second.server_cert, cert)
        ends = time.monotonic() + 10
        while _served(port) != _der(second):
            assert time.monotonic() < ends, "the rotated certificate was not served"
            time.sleep(0.1)
        cert.write_text("not a certificate")
        time.sleep(0.5)  # several looks at the files: the broken one is refused each time
        assert _served(port) == _der(second)


def _models_with(port: int, pki: Pki, client: Pki) -> int:
    """GET /v1/models over TLS with `client`'s certificate: its status, or 0 when the handshake fails."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(client.client_cert, client.client_key)
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\r\n\r\n")
            reply = tls.recv(65536)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return 0
    return int(reply.split()[1]) if reply else 0


def test_a_client_ca_removed_from_the_file_is_no_longer_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each change of the files builds a new context: OpenSSL's verify store only ever adds, so
    loading the new CA file into the old context kept a removed CA trusted until a restart."""
    monkeypatch.setattr(http_listener, "TLS_CHECK_S", 0.1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours, theirs = make_pki(tmp_path / "a"), make_pki(tmp_path / "b", ca_name="another CA")
    cas = tmp_path / "clients-ca.pem"
    cas.write_bytes(ours.ca_cert.read_bytes() + theirs.ca_cert.read_bytes())
    access = {
        "tls_cert_file": str(ours.server_cert),
        "tls_key_file": str(ours.server_key),
        "tls_client_ca_file": str(cas),
        "auth_token": "t",
    }
    settings = Settings(http={"port": free_port()}, access=access)
    with serving(settings, openai_app(settings, make_front(settings))):
        port = settings.http.port
        assert _models_with(port, ours, ours) == 200
        assert _models_with(port, ours, theirs) == 200
        cas.write_bytes(ours.ca_cert.read_bytes())  # their CA removed
        ends = time.monotonic() + 10
        while _models_with(port, ours, theirs) != 0:
            assert time.monotonic() < ends, "a removed client CA is still trusted"
            time.sleep(0.1)
        assert _models_with(port, ours, ours) == 200
