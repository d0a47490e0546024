"""A throwaway CA with a server and a client certificate, for the TLS tests."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # More client certificates, by common name: (certificate, key).
    clients: dict[str, tuple[Path, Path]] = dataclasses.field(default_factory=dict)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def make_pki(
    folder: Path, server_name: str = "localhost", clients: tuple[str, ...] = (), ca_name: str = "ragserve test CA"
) -> Pki:
    """Any other `server_name` is the server certificate's only name (no loopback address in it).
    `clients`: common names of more client certificates (in `Pki.clients`). Two CAs trusted side
    by side need two `ca_name`s (a verifier looks an issuer up by its name)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    local: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server_names = local if server_name == "localhost" else [x509.DNSName(server_name)]
    server_cert, server_key = leaf(server_name, ExtendedKeyUsageOID.SERVER_AUTH, server_names)
    client_cert, client_key = leaf("ragserve test client", ExtendedKeyUsageOID.CLIENT_AUTH, local)
    pki = Pki(
        folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem", folder / "client.key"
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    pki.client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, pki.server_key)
    _write_key(client_key, pki.client_key)
    for number, name in enumerate(clients):
        cert, key = leaf(name, ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName(f"client{number}.test")])
        paths = (folder / f"client{number}.pem", folder / f"client{number}.key")
        paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, paths[1])
        pki.clients[name] = paths
    return pki
