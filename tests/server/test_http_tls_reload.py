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
