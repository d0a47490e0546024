"""The Unix socket is never reachable with a looser mode than 0600, not even between bind and chmod.

The server binds inside a private 0700 directory and the socket appears at its configured path only
once it is 0600 (ragserve/server/unix_socket.py). Checked with the umask at 0 (bind(2) then makes
a 0777 socket), for the helper and for the real RagServer start-up (with a fake pipeline: no models).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragserve.config import AnswerSettings, IndexSettings, ObservabilitySettings, Settings, TransportSettings
from ragserve.errors import ConfigError
from ragserve.server import app
from ragserve.server.unix_socket import private_socket_path


@pytest.fixture
def open_umask() -> Iterator[None]:
    """bind(2) then creates sockets 0777: the worst case."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def test_helper_binds_in_a_private_folder_and_publishes_a_0600_socket(tmp_path: Path, open_umask: None) -> None:
    final = tmp_path / "rag.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        with private_socket_path(final) as bind_path:
            listener.bind(str(bind_path))
            listener.listen()
            assert _mode(bind_path) == 0o777  # what bind(2) made of it ...
            assert _mode(bind_path.parent) == 0o700  # ... where nobody else may look
            assert bind_path.parent.parent == tmp_path and os.lstat(bind_path.parent).st_uid == os.getuid()
            assert _mode(final) is None
        assert _mode(final) == 0o600 and stat.S_ISSOCK(os.lstat(final).st_mode)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rag.sock"]  # the private folder is gone
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(final))  # the same listening socket, now under its published name


def test_helper_leaves_nothing_when_binding_fails(tmp_path: Path) -> None:
    final = tmp_path / "rag.sock"
    with pytest.raises(RuntimeError), private_socket_path(final):
        raise RuntimeError("bind failed")
    assert list(tmp_path.iterdir()) == []


def test_helper_never_displaces_a_socket_that_appeared_meanwhile(tmp_path: Path) -> None:
    final = tmp_path / "rag.sock"
    with socket.socket(socket.AF_UNIX) as other, socket.socket(socket.AF_UNIX) as ours:
        other.bind(str(final))
        other_inode = os.lstat(final).st_ino
        with pytest.raises(ConfigError, match="already listening"), private_socket_path(final) as bind_path:
            ours.bind(str(bind_path))
    assert os.lstat(final).st_ino == other_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rag.sock"]


def test_helper_renames_where_hard_links_are_not_supported(tmp_path: Path, monkeypatch, open_umask: None) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    final = tmp_path / "rag.sock"
    with socket.socket(socket.AF_UNIX) as listener, private_socket_path(final) as bind_path:
        listener.bind(str(bind_path))
    assert _mode(final) == 0o600


class FakeStartupPipeline:
    """Just what RagServer.start touches, so no model or index is loaded."""

    def __init__(self) -> None:
        self.generator = None
        self.index = SimpleNamespace(version="fake")

    async def astart(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class SocketModeSpyServer:
    """The real grpc.aio server, noting the mode at the configured path right after each step of
    binding and starting (where grpc creates the socket), with `None` while it does not exist."""

    def __init__(self, real: grpc.aio.Server, path: Path) -> None:
        self._real = real
        self._path = path
        self.seen: list[tuple[str, int | None]] = []

    def add_insecure_port(self, address: str) -> int:
        port: int = self._real.add_insecure_port(address)
        self.seen.append(("add_insecure_port", _mode(self._path)))
        return port

    async def start(self) -> None:
        await self._real.start()
        self.seen.append(("start", _mode(self._path)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _uds_settings(path: Path) -> Settings:
    return Settings(
        transport=TransportSettings(uds_path=str(path)),
        answer=AnswerSettings(generation_enabled=False),
        observability=ObservabilitySettings(metrics_port=0),
        index=IndexSettings(reload_interval_s=0),
    )


def _health(path: Path) -> int:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return int(reply.status)


def test_server_socket_is_never_looser_than_0600(tmp_path: Path, monkeypatch, open_umask: None) -> None:
    monkeypatch.setattr(app, "make_pipeline", lambda settings, with_generator: FakeStartupPipeline())
    path = tmp_path / "rag.sock"
    loose: list[int] = []
    done = threading.Event()

    def watch() -> None:
        # Also look continuously, between the steps the spy sees.
        while not done.is_set():
            mode = _mode(path)
            if mode is not None and mode != 0o600:
                loose.append(mode)

    async def run() -> None:
        server = app.RagServer(_uds_settings(path))
        spy = SocketModeSpyServer(server.server, path)
        server.server = spy
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            await server.start()
        finally:
            done.set()
            watcher.join()
        try:
            assert [mode for _, mode in spy.seen if mode is not None and mode != 0o600] == []
            assert _mode(path) == 0o600
            assert await asyncio.to_thread(_health, path) == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.shutdown()
        assert _mode(path) is None

    asyncio.run(run())
    assert loose == []


def test_a_second_server_refused_at_start_up_leaves_the_first_ones_socket(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(app, "make_pipeline", lambda settings, with_generator: FakeStartupPipeline())
    path = tmp_path / "rag.sock"

    async def run() -> None:
        first = app.RagServer(_uds_settings(path))
        await first.start()
        try:
            second = app.RagServer(_uds_settings(path))
            with pytest.raises(ConfigError, match="already listening"):
                await second.start()
            await second.shutdown()  # as RagServer.run does on the way out
            assert _mode(path) == 0o600
            assert await asyncio.to_thread(_health, path) == health_pb2.HealthCheckResponse.SERVING
        finally:
            await first.shutdown()

    asyncio.run(run())
