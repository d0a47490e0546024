"""Server TLS that follows certificate rotation: the files are re-read when they change, no restart.

gRPC calls the fetcher on every TLS handshake (once per connection, never per request), so it only
stats the files and re-reads them when one changed (device, inode, size or mtime: an in-place
rewrite, a rename over the file, or a Kubernetes Secret's symlink flip). New files that cannot be
read, do not parse, or whose key does not match the certificate are refused: connections keep the
current certificate and the problem is logged once for that state of the files.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from ragserve.errors import ConfigError

log = logging.getLogger(__name__)

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


def load_certificate_configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
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
    return grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)], root_certificates=client_ca_pem)


class CertificateReloader:
    """The certificate-configuration fetcher behind `credentials`: cheap when nothing changed."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._paths = files.paths()
        self._lock = threading.Lock()
        # The state the current configuration (or the last refusal) was read from.
        self._seen = files_state(self._paths)
        initial = load_certificate_configuration(files)  # a bad start-up pair is a ConfigError
        self.credentials = grpc.dynamic_ssl_server_credentials(
            initial, self.fetch, require_client_authentication=bool(files.client_ca_file)
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """None keeps the current configuration; called by gRPC on a core thread, so it never raises."""
        state = files_state(self._paths)
        with self._lock:
            if state == self._seen:
                return None
            # Noted before reading: a write that lands after the stat changes the state again, so
            # the next handshake reads once more.
            self._seen = state
        try:
            config = load_certificate_configuration(self.files)
        except ConfigError as exc:
            log.warning("keeping the current TLS certificate: %s", exc)
            return None
        except Exception as exc:  # a fetcher that raises fails the handshake
            log.warning("keeping the current TLS certificate: %s: %s", type(exc).__name__, exc)
            return None
        log.info("TLS certificate reloaded from %s", self.files.cert_file)
        return config
