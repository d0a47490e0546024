"""The HNSW graph in a helper process, so loading a big version never stalls the serving process.

The helper (`python -m ragserve.index.graph_process FD PATH DIM COUNT NICE`) loads the file with
hnswlib (graph.load_graph; during a hot reload on a thread of lower priority), says it is ready,
then answers one search at a time over a socket pair: pickled tuples between two processes of this
program. A search costs one round trip beside the walk itself (BENCHMARKS.md, "A million
passages"). The serving process verifies the file's checksum first; the helper bounds-checks it
before hnswlib reads it, as for a graph in process. The helper exits when told to (its graph was
closed or garbage-collected), when its socket closes, or when the serving process is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ragserve import metrics
from ragserve.errors import IndexLoadError
from ragserve.index.graph import Graph, load_graph
from ragserve.priority import BACKGROUND_NICE, at_lower_priority

log = logging.getLogger(__name__)

# A million vectors load in about 2 s from the page cache; a cold disk or a busy host is slower.
READY_TIMEOUT_S = 600.0
# A search takes milliseconds; a helper silent this long is hung (stopped, swapping): replaced.
ANSWER_TIMEOUT_S = 10.0
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
_REAP_WAIT_S = 10.0


@dataclass
class _Helper:
    proc: subprocess.Popen[bytes]
    conn: Connection

    def ask(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        self.conn.send(request)
        if not self.conn.poll(ANSWER_TIMEOUT_S):
            raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S:.0f} s")
        reply: tuple[str, Any] = self.conn.recv()
        return reply

    def stop(self) -> None:
        # Say so rather than only close: a process forked from the server may hold our end too.
        with contextlib.suppress(OSError):
            self.conn.send(("exit",))
        self.conn.close()
        threading.Thread(target=_reap, args=(self.proc,), name="graph-helper-reaper", daemon=True).start()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(_REAP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stop_all(helpers: list[_Helper]) -> None:
    while helpers:
        helpers.pop().stop()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def start_helper(path: Path, dim: int, count: int, beside_requests: bool, ready_timeout_s: float) -> _Helper:
    """A helper process with the graph at `path` loaded (blocks until it is, without the GIL);
    `beside_requests`: it loads at a lower CPU priority, and then searches at its normal one."""
    ours, theirs = socket.socketpair()
    nice = BACKGROUND_NICE if beside_requests else 0
    with theirs:
        command = [sys.executable, "-m", __name__, str(theirs.fileno()), str(path), str(dim), str(count), str(nice)]
        proc = subprocess.Popen(command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=_child_env())
    helper = _Helper(proc, Connection(ours.detach()))
    try:
        if not helper.conn.poll(ready_timeout_s):
            raise IndexLoadError(f"index file {path}: its graph did not load in {ready_timeout_s:.0f} s")
        status, value = helper.conn.recv()
    except EOFError:
        helper.stop()
        try:
            ended = f"exited with code {proc.wait(_REAP_WAIT_S)}"
        except subprocess.TimeoutExpired:
            ended = "closed its socket"
        raise IndexLoadError(f"index file {path}: the process loading its graph {ended}") from None
    except BaseException:
        helper.stop()
        raise
    if status != "ready":
        helper.stop()
        raise IndexLoadError(str(value))
    return helper


class GraphProcess:
    """A Graph served by a helper process. A helper that dies is started again at the next search
    (which waits for the load); one search at a time, as hnswlib's index-wide ef needs anyway."""

    def __init__(
        self, path: Path, dim: int, count: int, beside_requests: bool = False, ready_timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """`beside_requests`: requests are being served while it loads (a hot reload)."""
        self._spec = (path, dim, count, ready_timeout_s)
        self._count = count
        self._lock = threading.Lock()
        self._helpers: list[_Helper] = [start_helper(path, dim, count, beside_requests, ready_timeout_s)]
        # Closed explicitly, or when the version holding it is garbage-collected after a reload.
        self._finalizer = weakref.finalize(self, _stop_all, self._helpers)
        self.restarts = 0

    @property
    def pid(self) -> int:
        return self._helpers[-1].proc.pid

    @property
    def count(self) -> int:
        return self._count

    def knn(
        self, vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        packed = None if allowed is None else np.packbits(allowed)
        labels, distances = self._call(("knn", np.ascontiguousarray(vector, dtype=np.float32), k, ef, packed))
        return labels, distances

    def items(self, rows: np.ndarray) -> np.ndarray:
        vectors: np.ndarray = self._call(("items", np.asarray(rows, dtype=np.int64)))
        return vectors

    def close(self) -> None:
        self._finalizer()

    def _call(self, request: tuple[Any, ...]) -> Any:
        with self._lock:
            if not self._finalizer.alive:
                raise IndexLoadError("this index version's graph is closed")
            try:
                if not self._helpers:
                    raise EOFError("its last start failed")
                status, value = self._helpers[-1].ask(request)
            except (EOFError, OSError) as exc:  # gone, or hung (TimeoutError)
                self._replace(exc)
                status, value = self._helpers[-1].ask(request)
        return self._value(status, value)

    @staticmethod
    def _value(status: str, value: Any) -> Any:
        if status == "runtime":
            raise RuntimeError(value)
        if status != "ok":
            raise IndexLoadError(f"the index's graph failed a search: {value}")
        return value

    def _replace(self, why: BaseException) -> None:
        """A new helper in place of the last (raises IndexLoadError when it cannot load: the next
        search tries again)."""
        reason = f"{type(why).__name__}: {why}" if str(why) else type(why).__name__
        log.error("the helper process serving %s is gone (%s); loading the graph again", self._spec[0], reason)
        if self._helpers:
            gone = self._helpers.pop()
            gone.proc.kill()  # dead already, or hung: either way it answers no more
            gone.stop()
        path, dim, count, ready_timeout_s = self._spec
        try:
            self._helpers.append(start_helper(path, dim, count, True, ready_timeout_s))
        except IndexLoadError as exc:
            log.error("the graph of %s could not be loaded again: %s", path, exc)
            # The caller hears why without the server's paths; the log has them.
            raise IndexLoadError("the index's graph is unavailable: its helper process did not start again") from None
        self.restarts += 1
        metrics.INDEX_GRAPH_HELPER_RESTARTS.inc()


# --- the helper process ---------------------------------------------------------------------------


def _answer(graph: Graph, request: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        if request[0] == "knn":
            _, vector, k, ef, packed = request
            allowed = None if packed is None else np.unpackbits(packed, count=graph.count).view(bool)
            return "ok", graph.knn(vector, k, ef, allowed)
        if request[0] == "items":
            return "ok", graph.items(request[1])
        return "error", f"unknown request {request[0]!r}"
    except RuntimeError as exc:  # hnswlib: fewer than k pass the filter
        return "runtime", str(exc)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _exit_when_orphaned(parent: int) -> None:
    """EOF alone does not say the server is gone (a process it forked may hold the socket)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def serve(fd: int, path: Path, dim: int, count: int, nice: int) -> int:
    # A Ctrl-C or a service manager's SIGTERM reaches the whole process group: the server decides
    # when its graph goes (it may still drain requests), and this process follows it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    conn = Connection(fd)
    try:
        graph = at_lower_priority(lambda: load_graph(path, dim, count), nice)
    except Exception as exc:
        conn.send(("error", str(exc)))
        return 1
    conn.send(("ready", graph.count))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return 0
        if request[0] == "exit":
            return 0
        conn.send(_answer(graph, request))


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
