"""Who may connect at all: the exposure rules for every listen address (the gRPC port and the HTTP
listener), checked once at start."""

from __future__ import annotations

from ragserve.addresses import is_loopback
from ragserve.config import Settings
from ragserve.errors import ConfigError


def check_exposure(settings: Settings) -> None:
    """A sidecar stays on loopback or a Unix socket unless the operator opts out AND protects it.

    Off loopback, TLS alone is not protection (any peer that trusts the server's certificate could
    call everything): callers must prove who they are, with a client certificate (mTLS) or a bearer
    token, and a token only travels inside TLS.
    """
    # RAGSERVE_TLS_ALLOWED_CLIENT_IDS without a client CA is refused by AccessSettings.
    if not (settings.transport.uds_path or is_loopback(settings.transport.host)):
        _check_protected(settings, settings.transport.host)
    if settings.http.port and not is_loopback(settings.http.host):  # the HTTP listener: the same rules
        _check_protected(settings, settings.http.host)


def _check_protected(settings: Settings, host: str) -> None:
    access = settings.access
    needs = (
        "TLS (RAGSERVE_TLS_CERT_FILE/RAGSERVE_TLS_KEY_FILE) with client certificates "
        "(RAGSERVE_TLS_CLIENT_CA_FILE), a bearer token (RAGSERVE_AUTH_TOKEN) or API keys (RAGSERVE_API_KEYS_FILE)"
    )
    if not access.allow_non_loopback:
        raise ConfigError(f"refusing to listen on {host}: set RAGSERVE_ALLOW_NON_LOOPBACK=true with {needs}")
    has_tls = bool(access.tls_cert_file and access.tls_key_file)
    if not has_tls:
        raise ConfigError(
            f"listening on {host} needs {needs}; a bearer token over plaintext is readable on the network"
        )
    if not (access.tls_client_ca_file or access.auth_token or access.api_keys_file):
        raise ConfigError(f"listening on {host} with TLS alone lets any peer in: it needs {needs}")


def check_http_protected(settings: Settings) -> None:
    """Beside a 0600 Unix socket a loopback HTTP listener would let any local user in: it needs a token
    or client certificates then (off loopback, check_exposure already asks for them)."""
    access = settings.access
    certificates = bool(access.tls_cert_file and access.tls_key_file and access.tls_client_ca_file)
    if settings.transport.uds_path and not (access.auth_token or access.api_keys_file or certificates):
        raise ConfigError(
            f"the HTTP listener (RAGSERVE_HTTP_PORT={settings.http.port}) would let any local "
            "user past the private Unix socket (RAGSERVE_UDS_PATH): set RAGSERVE_AUTH_TOKEN or "
            "RAGSERVE_API_KEYS_FILE, or TLS with client certificates "
            "(RAGSERVE_TLS_CERT_FILE, RAGSERVE_TLS_KEY_FILE, RAGSERVE_TLS_CLIENT_CA_FILE)"
        )
