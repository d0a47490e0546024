"""Who a caller is, the same on every door: the `Authorization` value it sent and the names of its
verified client certificate in, the names its grant and caller limits go by out, or a refusal.

- a bearer credential, when a shared token (RAGSERVE_AUTH_TOKEN) or named keys
  (RAGSERVE_API_KEYS_FILE, ragserve/api_keys.py) are set, must be the token or a known key; a key
  adds its caller's name, the token names nobody;
- a certificate, when RAGSERVE_TLS_ALLOWED_CLIENT_IDS is set, must carry one of the allowed names;
  its names are the caller's too.

Comparison is constant-time; a wrong, revoked or expired key gets the same refusal by the same
path; a credential never reaches a log line or an error.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from ragserve.api_keys import KeyFile
from ragserve.config import AccessSettings
from ragserve.errors import ConfigError, PermissionDenied, Unauthenticated

WRONG_CREDENTIAL = "missing or invalid bearer token"
_BEARER = b"Bearer "


class Identity:
    def __init__(self, access: AccessSettings) -> None:
        self._token = access.auth_token.encode() if access.auth_token else None
        self._keys: KeyFile | None = None
        if access.api_keys_file:
            try:
                self._keys = KeyFile(Path(access.api_keys_file).expanduser())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"RAGSERVE_API_KEYS_FILE: {exc}") from None
        ids = access.tls_allowed_client_ids.split(",")
        self.allowed = frozenset(name.strip() for name in ids if name.strip())

    @property
    def wants_credential(self) -> bool:
        return self._token is not None or self._keys is not None

    def key_name(self, authorization: str | bytes | None) -> str | None:
        """The caller a named key names; None for the shared token or when no credential is wanted;
        Unauthenticated for anything else."""
        if not self.wants_credential:
            return None
        presented = authorization.encode() if isinstance(authorization, str) else (authorization or b"")
        secret = presented[len(_BEARER) :] if presented.startswith(_BEARER) else b""
        name = self._keys.name_of(secret) if self._keys is not None else None
        # Both are always compared: a wrong key costs what a right one does.
        token_matches = self._token is not None and hmac.compare_digest(secret, self._token)
        if name is not None:
            return name
        if token_matches:
            return None
        raise Unauthenticated(WRONG_CREDENTIAL)

    def check_certificate(self, certificate_names: set[str]) -> None:
        """PermissionDenied when allowed ids are set and the certificate carries none of them."""
        if self.allowed and not certificate_names & self.allowed:
            raise PermissionDenied("client certificate is not allowed")

    def caller(self, authorization: str | bytes | None, certificate_names: set[str]) -> set[str]:
        """The names the caller goes by, once what it presented passes."""
        name = self.key_name(authorization)
        self.check_certificate(certificate_names)
        return {*certificate_names, name} if name is not None else set(certificate_names)
