"""The server's TLS files, whichever listener serves them: their state on disk (what a change is)
and the checks a new set must pass before any listener loads it (readable, PEM, the key matches
the certificate, the client CA parses). No gRPC, no Starlette: the gRPC port (server/grpc/tls.py)
and the HTTP listener (server/http/listener.py) each load the files their own way."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from ragserve.errors import ConfigError

# Per file: (device, inode, size, mtime in ns), or the errno of a failed stat.
FileState = tuple[int, int, int, int] | tuple[str, int]


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    # With a client CA, clients must present a certificate it signed (mTLS).
    client_ca_file: str = ""

    def paths(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file, *((self.client_ca_file,) if self.client_ca_file else ()))


@dataclass(frozen=True)
class TlsPems:
    """The files' bytes, checked."""

    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None


def files_state(paths: tuple[str, ...]) -> tuple[FileState, ...]:
    states: list[FileState] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows symlinks: a Secret's ..data flip changes the inode
        except OSError as exc:
            states.append(("unreadable", exc.errno or 0))
            continue
        states.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(states)


def _public_key_der(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def read_checked(files: TlsFiles) -> TlsPems:
    """Read and check the files; ConfigError names the file and the problem."""
    try:
        cert_pem = Path(files.cert_file).read_bytes()
        key_pem = Path(files.key_file).read_bytes()
        client_ca_pem = Path(files.client_ca_file).read_bytes() if files.client_ca_file else None
    except OSError as exc:
        raise ConfigError(f"cannot read TLS files: {exc}") from exc
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"TLS certificate {files.cert_file} is not a PEM certificate chain") from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"TLS key {files.key_file} is not an unencrypted PEM private key") from exc
    if _public_key_der(key.public_key()) != _public_key_der(chain[0].public_key()):
        raise ConfigError(f"TLS key {files.key_file} does not match the certificate {files.cert_file}")
    if client_ca_pem is not None:
        try:
            x509.load_pem_x509_certificates(client_ca_pem)
        except ValueError as exc:
            raise ConfigError(f"TLS client CA {files.client_ca_file} is not a PEM certificate bundle") from exc
    return TlsPems(cert_pem, key_pem, client_ca_pem)
