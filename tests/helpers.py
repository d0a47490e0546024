"""Small helpers shared by tests and benchmarks (fixtures live in the conftest files, fakes in
tests/fakes.py)."""

from __future__ import annotations

import socket

# Ports handed out by this process. A server given a port binds it only when it is up (a vLLM
# server after about a minute), and until then the kernel may offer the same port again: a gRPC
# server started meanwhile took a vLLM server's port once, and the HTTP probe read HTTP/2 frames.
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port nobody listens on right now and that this process never handed out."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def pdf_file(objects: list[bytes], trailer: str = "") -> bytes:
    """A PDF of numbered `objects` (1 is the catalog) with a correct cross-reference table, so a
    strict reader accepts it; `trailer`: more trailer entries (e.g. "/Info 6 0 R")."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R {trailer}>>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
