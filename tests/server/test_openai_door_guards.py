"""What the OpenAI-compatible door refuses before any call: a Host it does not answer to (DNS
rebinding), a POST that is not JSON (a cross-site form), a Unix-socket server with no token; and
what it bounds: connections open at once, a request's headers and body in time, a client gone
mid-upload logged in one line. Over raw sockets, so each byte and each close is the test's own.
No pipeline behind the door: a request that passes every check gets 503 (still loading)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragserve.config import Settings
from ragserve.errors import ConfigError
from ragserve.server.app import RagServer, make_front
from ragserve.server.exposure import check_http_protected
from tests.helpers import free_port
from tests.server.test_openai_door import openai_app, serving

ASK = b'{"messages": [{"role": "user", "content": "What is HNSW?"}]}'


def _settings(**http: object) -> Settings:
    return Settings(http={"port": free_port(), **http})  # type: ignore[arg-type]


@contextlib.contextmanager
def _door(settings: Settings) -> Iterator[int]:
    with serving(settings, openai_app(settings, make_front(settings))):
        yield settings.http.port


def _connect(port: int, timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close)."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _ask(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """One request (its head written whole, `Connection: close` added) and its status and JSON body."""
    with _connect(port) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"Connection: close\r\n\r\n" + body)
        reply = _read_all(sock)
    head_out, _, body_out = reply.partition(b"\r\n\r\n")
    return int(head_out.split()[1]), json.loads(body_out) if body_out else {}


def _models(port: int, host: str | None) -> int:
    return _ask(port, "GET /v1/models HTTP/1.1\n" + (f"Host: {host}\n" if host is not None else ""))[0]


def test_a_host_the_door_does_not_answer_to_is_refused() -> None:
    """A DNS-rebinding page sends its own name as Host: 421; no Host at all: 400. The listener's
    address (with or without a port), localhost on loopback and an operator's names pass."""
    with _door(_settings(allowed_hosts="Proxy.Example, other.example")) as port:
        status, body = _ask(port, f"GET /v1/models HTTP/1.1\nHost: rebound.attacker.example:{port}\n")
        assert status == 421
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "host"
        assert "RAGSERVE_HTTP_ALLOWED_HOSTS" in body["error"]["message"]
        assert _models(port, None) == 400
        assert _models(port, "127.0.0.2") == 421
        assert _models(port, "localhost.attacker.example") == 421
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", "proxy.example:443"):
            assert _models(port, host) == 200, host


def test_a_post_that_is_not_json_is_415() -> None:
    """A cross-site `text/plain` or form POST needs no CORS preflight: refused before its body is read."""
    with _door(_settings()) as port:
        for kind in ("text/plain", "application/x-www-form-urlencoded", None):
            typed = f"Content-Type: {kind}\n" if kind else ""
            head = f"POST /v1/chat/completions HTTP/1.1\nHost: 127.0.0.1\n{typed}Content-Length: {len(ASK)}\n"
            status, body = _ask(port, head, ASK)
            assert status == 415 and "application/json" in body["error"]["message"], kind
        typed = f"Content-Type: Application/JSON; charset=utf-8\nContent-Length: {len(ASK)}\n"
        status, body = _ask(port, f"POST /v1/chat/completions HTTP/1.1\nHost: 127.0.0.1\n{typed}", ASK)
        assert status == 503 and "loading" in body["error"]["message"]


def test_a_unix_socket_server_without_a_token_does_not_open_the_door(tmp_path: Path) -> None:
    """gRPC on a 0600 socket keeps other local users out; a loopback door beside it would let them in."""
    uds = {"uds_path": str(tmp_path / "rag.sock")}
    bare = Settings(transport=uds, http={"port": free_port()})
    with pytest.raises(ConfigError, match="RAGSERVE_AUTH_TOKEN") as refused:
        RagServer(bare)
    assert "RAGSERVE_UDS_PATH" in str(refused.value) and "RAGSERVE_TLS_CLIENT_CA_FILE" in str(refused.value)
    with_token = Settings(transport=uds, http={"port": free_port()}, access={"auth_token": "t"})
    check_http_protected(with_token)
    mtls = {"tls_cert_file": "s.pem", "tls_key_file": "s.key", "tls_client_ca_file": "ca.pem"}
    check_http_protected(Settings(transport=uds, http={"port": free_port()}, access=mtls))
    check_http_protected(_settings())  # gRPC on TCP: the door opens as before


def test_a_connection_that_trickles_its_headers_is_closed_at_the_deadline() -> None:
    with _door(_settings(header_timeout_s=1.0)) as port:
        began = time.monotonic()
        with _connect(port, timeout_s=0.2) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            reply = None
            while reply is None and time.monotonic() - began < 5.0:
                try:
                    sock.sendall(b"x")  # a byte every 0.2 s: each one is "progress"
                    reply = sock.recv(65536)
                except TimeoutError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    reply = b""
            took = time.monotonic() - began
            sock.settimeout(5.0)
            reply = (reply or b"") + _read_all(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"RAGSERVE_HTTP_HEADER_TIMEOUT_S" in reply
        assert 0.9 < took < 3.0, took
        with _connect(port) as silent:  # a socket that never says a word is closed too, unanswered
            began = time.monotonic()
            assert _read_all(silent) == b""
            assert 0.9 < time.monotonic() - began < 3.0


def test_a_request_head_past_its_bound_is_431_and_closed() -> None:
    """httptools bounds no header: without the listener's bound (64 KiB) uvicorn would keep them all."""
    with _door(_settings()) as port, _connect(port) as sock:
        headers = "".join(f"X-{i}: {'a' * 1000}\r\n" for i in range(70))  # 70 KB
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}".encode())  # all read at once
        reply = _read_all(sock)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


def test_a_body_that_does_not_arrive_in_time_is_408_and_closed() -> None:
    with _door(_settings(body_timeout_s=1.0)) as port, _connect(port) as sock:
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(ASK)}\r\n\r\n".encode() + ASK[:10])
        began = time.monotonic()
        reply = _read_all(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"RAGSERVE_HTTP_BODY_TIMEOUT_S" in reply, reply[:200]
        assert b"connection: close" in reply.lower() and time.monotonic() - began < 3.0
    with _door(_settings(body_timeout_s=1.0)) as port, _connect(port) as sock:
        # Answered before its body was read (a GET with a body): the body still has its deadline.
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nxx")
        began = time.monotonic()
        reply = _read_all(sock)
        assert reply.startswith(b"HTTP/1.1 200") and time.monotonic() - began < 3.0, reply[:200]


def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one() -> None:
    """Silent sockets fill the cap: each new connection closes the oldest of them, so a request
    still gets in; the silent ones are closed unanswered, oldest first."""
    cap = 4
    with _door(_settings(max_connections=cap, header_timeout_s=30.0)) as port:
        held = [_connect(port) for _ in range(cap)]
        try:
            time.sleep(0.3)  # all accepted and counted
            assert _models(port, "127.0.0.1") == 200  # in, though the cap was full
            assert _read_all(held[0]) == b""  # the oldest silent one made room, unanswered
            for sock in held[1:]:
                sock.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    sock.recv(1)  # the younger ones are still open
        finally:
            for sock in held:
                sock.close()


def test_at_the_cap_with_every_connection_in_a_request_a_new_one_is_503() -> None:
    cap = 3
    with _door(_settings(max_connections=cap, body_timeout_s=30.0)) as port:
        busy = [_connect(port) for _ in range(cap)]
        try:
            head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            for sock in busy:  # a head whole, a body that does not come: each in a request
                sock.sendall(f"{head}Expect: 100-continue\r\nContent-Length: {len(ASK)}\r\n\r\n".encode())
                sock.settimeout(10)
                assert sock.recv(64).startswith(b"HTTP/1.1 100")  # the door is reading its body
            with _connect(port) as extra:
                reply = _read_all(extra)  # answered at once, never left hanging
            assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
            body = json.loads(reply.partition(b"\r\n\r\n")[2])
            assert "RAGSERVE_HTTP_MAX_CONNECTIONS" in body["error"]["message"]
            busy[0].close()
            time.sleep(0.3)
            assert _models(port, "127.0.0.1") == 200  # room again
        finally:
            for sock in busy:
                sock.close()


def test_a_client_gone_mid_upload_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with _door(_settings()) as port:
        with _connect(port) as sock:
            head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            sock.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode() + ASK[:10])
            time.sleep(0.2)  # the handler is reading the body
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not any("left before" in r.getMessage() for r in caplog.records):
            time.sleep(0.05)
    lines = [r for r in caplog.records if "left before" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert "Traceback" not in caplog.text and "Exception in ASGI application" not in caplog.text


def test_every_connection_sends_at_once_without_waiting_for_an_ack() -> None:
    """TCP_NODELAY on the listening socket, which accepted connections inherit: without it a
    kept-alive connection's second request waited ~40 ms for a delayed ACK (BENCHMARKS.md)."""
    from ragserve.server.http.listener import HttpListener

    settings = _settings()
    sock = HttpListener(lambda *a: None, "127.0.0.1", settings.http.port, settings)._bind()  # type: ignore[arg-type]
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
