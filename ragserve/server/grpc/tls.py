"""The gRPC port's TLS that follows certificate rotation: the files are re-read when they change, no restart.

gRPC calls the fetcher on every TLS handshake (once per connection, never per request), so it only
stats the files and re-reads them when one changed (device, inode, size or mtime: an in-place
rewrite, a rename over the file, or a Kubernetes Secret's symlink flip). New files that cannot be
read, do not parse, or whose key does not match the certificate are refused (server/tls_files.py):
connections keep the current certificate and the problem is logged once for that state of the files.
"""

from __future__ import annotations

import logging
import threading

import grpc

from ragserve.errors import ConfigError
from ragserve.server.tls_files import TlsFiles, files_state, read_checked

log = logging.getLogger(__name__)


def load_certificate_configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    """Read and check the files; ConfigError names the file and the problem."""
    pems = read_checked(files)
    return grpc.ssl_server_certificate_configuration(
        [(pems.key_pem, pems.cert_pem)], root_certificates=pems.client_ca_pem
    )


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
