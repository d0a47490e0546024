"""Small helpers shared by tests and benchmarks (fixtures live in the conftest files, fakes in
tests/fakes.py)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
