"""The exposure rules (ragserve.server.exposure): who may listen where, checked before the server binds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ragserve.config import Settings
from ragserve.errors import ConfigError
from ragserve.server.exposure import check_exposure

TLS = {"tls_cert_file": "server.pem", "tls_key_file": "server.key"}
OFF_LOOPBACK = {"host": "0.0.0.0", "allow_non_loopback": True}
TRANSPORT = {"host", "uds_path"}


def _settings(flat: dict[str, object]) -> Settings:
    """The cases below name fields flat; host and uds_path are transport settings, the rest access."""
    transport = {k: v for k, v in flat.items() if k in TRANSPORT}
    access = {k: v for k, v in flat.items() if k not in TRANSPORT}
    return Settings(transport=transport, access=access)  # type: ignore[arg-type]


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
    check_exposure(_settings(settings))


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"host": "0.0.0.0"}, "RAGSERVE_ALLOW_NON_LOOPBACK"),
        (OFF_LOOPBACK, "TLS"),
        ({**OFF_LOOPBACK, **TLS}, "TLS alone"),
        ({**OFF_LOOPBACK, "auth_token": "t"}, "plaintext"),
    ],
)
def test_refused(settings: dict[str, object], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        check_exposure(_settings(settings))


def test_pinned_client_ids_need_client_certificates() -> None:
    with pytest.raises(ValidationError, match="RAGSERVE_TLS_CLIENT_CA_FILE"):
        _settings({"tls_allowed_client_ids": "app"})


def test_the_openai_door_keeps_the_same_exposure_rules() -> None:
    """The HTTP door off loopback needs what the gRPC port needs off loopback; on loopback, nothing."""
    check_exposure(Settings(http={"port": 8000}))  # 127.0.0.1 by default
    with pytest.raises(ConfigError, match="RAGSERVE_ALLOW_NON_LOOPBACK"):
        check_exposure(Settings(http={"port": 8000, "host": "0.0.0.0"}))
    with pytest.raises(ConfigError, match="plaintext"):
        check_exposure(
            Settings(http={"port": 8000, "host": "0.0.0.0"}, access={"allow_non_loopback": True, "auth_token": "t"})
        )
    protected = {"allow_non_loopback": True, "auth_token": "t", **TLS}
    check_exposure(Settings(http={"port": 8000, "host": "0.0.0.0"}, access=protected))
    check_exposure(Settings(http={"port": 0, "host": "0.0.0.0"}))  # off: its host is never bound
