"""One caller cannot hold the HTTP listener: its GET streams on /mcp, its stalled bodies and its
silent TLS handshakes are each bounded (405 at once; RAGSERVE_HTTP_BODY_TIMEOUT_S and
RAGSERVE_HTTP_MAX_REQUESTS_PER_CALLER; RAGSERVE_HTTP_HEADER_TIMEOUT_S and the connection cap),
while another key's search is answered. And what the MCP door checks as the others do: the first
Authorization header, a foreign Origin (403), a client gone mid-body (one log line).

Over raw sockets (plain and TLS) on loopback, against every door over one front
(tests/server/doors.py), bounded in sockets (under 40) and in time (seconds)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from tests.certs import Pki, make_pki
from tests.fakes import FakeGenerator
from tests.server.doors import Doors, serving_doors

CAP = 8  # connections
PER_CALLER = 3  # open requests per caller
HEADER_S, BODY_S, KEEP_ALIVE_S = 1.0, 1.5, 1
SEARCH_CALL = {"name": "search", "arguments": {"query": "tides"}}
SEARCH = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "search", "arguments": {"query": "tides"}},
}
MCP_ACCEPT = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def held(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder, pki: Pki
) -> Iterator[Doors]:
    """The doors over TLS, with a small cap and short deadlines."""
    key_file = tmp_path_factory.mktemp("held-keys") / "keys"
    http = {
        "max_connections": CAP,
        "max_requests_per_caller": PER_CALLER,
        "header_timeout_s": HEADER_S,
        "body_timeout_s": BODY_S,
        "keep_alive_s": KEEP_ALIVE_S,
        "allowed_origins": "http://agent.example",
    }
    access = {"tls_cert_file": str(pki.server_cert), "tls_key_file": str(pki.server_key)}
    with serving_doors(access_index, embedder, key_file, FakeGenerator(words=["It."]), http, access) as doors:
        yield doors


def _port(doors: Doors) -> int:
    return int(doors.http_url.rpartition(":")[2])


def _tls(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca_cert))


def _tls_connect(port: int, pki: Pki) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return _tls(pki).wrap_socket(raw, server_hostname="localhost")


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed the socket, or None when it is still open then."""
    sock.settimeout(0.1)
    out, ends = b"", time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, ssl.SSLError, OSError):
            return out
        if not chunk:
            return out
        out += chunk
    return None


def _server_sockets(port: int) -> int:
    """The listener's side of the connections open now (this process is both ends)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.raddr and c.status == psutil.CONN_ESTABLISHED
    )


def _mcp_head(key: str, length: int, method: str = "POST", extra: str = "") -> bytes:
    return (
        f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nAccept: {MCP_ACCEPT}\r\nContent-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _search(doors: Doors, key: str, verify: Any = True, **headers: str) -> httpx.Response:
    sent = {"authorization": f"Bearer {key}", "accept": MCP_ACCEPT, **headers}
    return httpx.post(f"{doors.http_url}/mcp", json=SEARCH, headers=sent, timeout=10, verify=verify)


def _passages(reply: httpx.Response) -> list[Any]:
    data = [line[5:] for line in reply.text.splitlines() if line.startswith("data:")]
    message = json.loads(data[-1] if data else reply.text)
    return list(message["result"]["structuredContent"]["passages"])


def test_one_key_holding_every_connection_it_can_does_not_keep_another_out(held: Doors, pki: Pki) -> None:
    port, alice, bob = _port(held), held.keys["alice"], held.keys["bob"]
    sockets: dict[str, list[socket.socket]] = {"stream": [], "stalled": [], "silent": []}
    try:
        for _ in range(3):  # GET streams: a stateless door has none to give (405), nothing held
            sock = _tls_connect(port, pki)
            sock.sendall(_mcp_head(alice, 0, "GET").replace(b"Content-Length: 0\r\n", b""))
            sockets["stream"].append(sock)
        for _ in range(PER_CALLER + 1):  # bodies that never arrive: in a request until the deadline
            sock = _tls_connect(port, pki)
            sock.sendall(_mcp_head(alice, 1000) + b'{"jsonrpc"')
            sockets["stalled"].append(sock)
        time.sleep(0.5)  # their heads read: each in a request, not to be closed for room
        for _ in range(20):  # TCP connections that never start their TLS handshake
            sockets["silent"].append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.3)
        assert _server_sockets(port) <= CAP
        began = time.monotonic()
        reply = _search(held, bob, verify=_tls(pki))
        assert reply.status_code == 200 and _passages(reply), reply.text[:300]
        assert time.monotonic() - began < 3.0
        streams = [_closed_within(sock, KEEP_ALIVE_S + 2) for sock in sockets["stream"]]
        assert all(s is not None and s.startswith(b"HTTP/1.1 405") for s in streams), streams
        stalled = [_closed_within(sock, BODY_S + 2) for sock in sockets["stalled"]]
        assert all(s is not None for s in stalled), "a stalled body held its connection past the deadline"
        assert sum(s.startswith(b"HTTP/1.1 429") for s in stalled if s) == 1, [s[:12] for s in stalled if s]
        assert sum(s.startswith(b"HTTP/1.1 408") for s in stalled if s) + 1 <= PER_CALLER + 1
        silent = [_closed_within(sock, HEADER_S + 2) for sock in sockets["silent"]]
        assert all(s == b"" for s in silent), "a silent handshake held its connection past the deadline"
        assert time.monotonic() - began < HEADER_S + BODY_S + KEEP_ALIVE_S + 8
        ends = time.monotonic() + HEADER_S + 1  # a TLS goodbye unanswered ends within the header deadline
        while _server_sockets(port) and time.monotonic() < ends:
            time.sleep(0.1)
        assert _server_sockets(port) == 0
    finally:
        for group in sockets.values():
            for sock in group:
                sock.close()


def test_a_silent_tls_handshake_counts_under_the_cap_and_ends_at_the_header_deadline(held: Doors, pki: Pki) -> None:
    """50 TCP clients that never send a ClientHello, on a listener capped at 8 with a 1 s header
    deadline: at most 8 server-side sockets at any time, every one closed within the deadline."""
    port = _port(held)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(50)]
    try:
        time.sleep(0.3)
        assert _server_sockets(port) <= CAP
        began = time.monotonic()
        assert all(_closed_within(sock, HEADER_S + 2) == b"" for sock in silent)
        assert time.monotonic() - began < HEADER_S + 2
    finally:
        for sock in silent:
            sock.close()


def test_a_stalled_mcp_body_is_408_at_the_deadline(held: Doors, pki: Pki) -> None:
    with _tls_connect(_port(held), pki) as sock:
        sock.sendall(_mcp_head(held.keys["bob"], 1000) + b'{"jsonrpc"')
        began = time.monotonic()
        reply = _closed_within(sock, BODY_S + 3)
    assert reply is not None and reply.startswith(b"HTTP/1.1 408"), reply
    assert b"RAGSERVE_HTTP_BODY_TIMEOUT_S" in reply and BODY_S - 0.2 < time.monotonic() - began < BODY_S + 2


def test_an_mcp_client_gone_mid_body_is_one_log_line(held: Doors, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with _tls_connect(_port(held), pki) as sock:
        sock.sendall(_mcp_head(held.keys["bob"], 1000) + b'{"jsonrpc"')
        time.sleep(0.3)  # the door is reading the body
    ends = time.monotonic() + 5
    while time.monotonic() < ends and not any("left before" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    assert [r.levelno for r in caplog.records if "left before" in r.getMessage()] == [logging.INFO]
    assert not [r for r in caplog.records if r.exc_info] and "Traceback" not in caplog.text


def test_mcp_answers_get_with_405(doors: Doors) -> None:
    """A stateless door has no server-to-client stream: GET would only hold a connection."""
    headers = {"authorization": f"Bearer {doors.keys['alice']}", "accept": "text/event-stream"}
    with httpx.Client(timeout=5) as client:
        reply = client.get(f"{doors.http_url}/mcp", headers=headers)
    assert reply.status_code == 405


def test_mcp_refuses_a_foreign_origin(held: Doors, pki: Pki) -> None:
    """The MCP transport's own rule against DNS rebinding: no Origin (not a browser), this host's
    (any port) and a configured one pass; any other is 403."""
    cases = {
        None: 200,
        "https://127.0.0.1:1234": 200,
        "http://agent.example": 200,  # RAGSERVE_HTTP_ALLOWED_ORIGINS
        "http://rebound.attacker.example": 403,
        "null": 403,
    }
    for origin, status in cases.items():
        reply = _search(held, held.keys["alice"], verify=_tls(pki), **({"origin": origin} if origin else {}))
        assert reply.status_code == status, (origin, reply.text[:300])
        if status == 403:
            assert "RAGSERVE_HTTP_ALLOWED_ORIGINS" in reply.json()["error"]["message"]


def test_mcp_reads_the_first_authorization_header_as_every_door(doors: Doors) -> None:
    port = _port(doors)
    good, bad = doors.keys["bob"], "not-a-key"

    def status(first: str, second: str) -> int:
        body = json.dumps(SEARCH).encode()
        head = _mcp_head(first, len(body), extra=f"Authorization: Bearer {second}\r\nConnection: close\r\n")
        with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as sock:
            sock.sendall(head + body)
            reply = _closed_within(sock, 10) or b""
        return int(reply.split()[1])

    assert status(good, bad) == 200
    assert status(bad, good) == 401
