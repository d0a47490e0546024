"""The exposure rules of ragserve.server.auth: who may listen where, checked before the server binds (no sockets)."""

from __future__ import annotations

import pytest

from ragserve.config import Settings
from ragserve.errors import ConfigError
from ragserve.server.auth import check_exposure

TLS = {"tls_cert_file": "server.pem", "tls_key_file": "server.key"}
OFF_LOOPBACK = {"host": "0.0.0.0", "allow_non_loopback": True}


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"uds_path": "/run/ragserve.sock"},
        {"auth_token": "t"},  # on loopback a token needs no TLS
        {**OFF_LOOPBACK, **TLS, "tls_client_ca_file": "ca.pem"},
        {**OFF_LOOPBACK, **TLS, "auth_token": "t"},
        {**OFF_LOOPBACK, **TLS, "tls_client_ca_file": "ca.pem", "tls_allowed_client_ids": "app"},
    ],
)
def test_allowed(settings: dict[str, object]) -> None:
    check_exposure(Settings(**settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"host": "0.0.0.0"}, "RAGSERVE_ALLOW_NON_LOOPBACK"),
        (OFF_LOOPBACK, "TLS"),
        ({**OFF_LOOPBACK, **TLS}, "TLS alone"),
        ({**OFF_LOOPBACK, "auth_token": "t"}, "plaintext"),
        ({"tls_allowed_client_ids": "app"}, "RAGSERVE_TLS_CLIENT_CA_FILE"),
    ],
)
def test_refused(settings: dict[str, object], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        check_exposure(Settings(**settings))  # type: ignore[arg-type]
