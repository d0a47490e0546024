"""A real redis-server started by the test on a free loopback port (never a system Redis)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers import free_port


def _ping(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """Start, kill (SIGKILL), pause (SIGSTOP/SIGCONT) and restart one redis-server on one port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (deploy/local/setup.sh installs the Debian package)")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"redis-{self.port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.workdir),
                    "--protected-mode", "yes",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if _ping(self.port):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
