"""The HNSW graph in a helper process, so loading a big version never stalls the serving process.

The helper (`python -m ragserve.index.graph_process FD PATH DIM COUNT NICE`, graph_helper.py) loads
the file with hnswlib (graph.load_graph; during a hot reload on a thread of lower priority), says it is ready,
then answers one search at a time over a socket pair: pickled tuples between two processes of this
program. A search costs one round trip beside the walk itself (BENCHMARKS.md, "A million
passages"). The serving process verifies the file's checksum first; the helper bounds-checks it
before hnswlib reads it, as for a graph in process. The helper exits when told to (its graph was
closed or garbage-collected), when its socket closes, or when the serving process is gone.

A version whose graph extends one a helper serves (the indexer added rows and changed nothing
else: its manifest's `graph_base`) is served by that helper: it adds the new rows from the
version's vectors file on a thread of lower priority while it keeps answering, and each version's
view searches only its own rows. So a reload that adds documents holds one graph, not two.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
from ragserve.index.graph import GraphFile
from ragserve.priority import BACKGROUND_NICE

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


# What the helper keeps of the server's environment (Python, its libraries' paths and threads); no
# token, API key or Qdrant key reaches a process that only reads a graph file.
_CHILD_ENV = ("PATH", "HOME", "TMPDIR", "TZ", "LANG", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
_CHILD_ENV_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_")


def _child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key in _CHILD_ENV or key.startswith(_CHILD_ENV_PREFIXES)}
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


class _Helpers:
    """The helper process behind one or more versions' views of its graph (more than one when a
    version's graph was grown from another's), and its replacements."""

    def __init__(self, file: GraphFile, ready_timeout_s: float) -> None:
        self.ready_timeout_s = ready_timeout_s
        # Re-entrant: a view's finalizer may run (the collector) while this thread holds it.
        self.lock = threading.RLock()
        self.running = [start_helper(file.path, file.dim, file.count, file.beside_requests, ready_timeout_s)]
        self.views: dict[int, GraphFile] = {}  # each open view's version's file
        self.files = [file]  # the graph as loaded and as grown since: what a replacement may load
        self.restarts = 0

    def add_view(self, file: GraphFile) -> int:
        with self.lock:
            token = max(self.views, default=0) + 1
            self.views[token] = file
            return token

    def release(self, token: int) -> None:
        """A view is closed or gone; the last one stops the helper."""
        with self.lock:
            del self.views[token]
            if not self.views:
                _stop_all(self.running)
            rows = max((file.count for file in self.views.values()), default=0)
            self.files = [file for file in self.files if file.count >= rows]

    def _candidates(self) -> list[GraphFile]:
        """What a replacement loads: the open views' files, most rows first (a version grown but
        refused is let go, so the served one's), then the files the graph was grown to since,
        which hold the same rows and more (the served one's folder may have been pruned)."""
        first: dict[Path, GraphFile] = {}
        for file in sorted(self.views.values(), key=lambda f: -f.count) + sorted(self.files, key=lambda f: -f.count):
            first.setdefault(file.path, file)
        return list(first.values())

    def call(self, request: tuple[Any, ...]) -> Any:
        with self.lock:
            try:
                if not self.running:
                    raise EOFError("its last start failed")
                status, value = self.running[-1].ask(request)
            except (EOFError, OSError) as exc:  # gone, or hung (TimeoutError)
                self._replace(exc)
                status, value = self.running[-1].ask(request)
        if status == "runtime":
            raise RuntimeError(value)
        if status != "ok":
            raise IndexLoadError(f"the index's graph failed a search: {value}")
        return value

    def _replace(self, why: BaseException) -> None:
        """A new helper in place of the last (raises IndexLoadError when it cannot load: the next
        search tries again)."""
        reason = f"{type(why).__name__}: {why}" if str(why) else type(why).__name__
        log.error("the helper process serving a graph is gone (%s); loading the graph again", reason)
        if self.running:
            gone = self.running.pop()
            gone.proc.kill()  # dead already, or hung: either way it answers no more
            gone.stop()
        for file in self._candidates():
            try:
                self.running.append(start_helper(file.path, file.dim, file.count, True, self.ready_timeout_s))
            except IndexLoadError as exc:
                log.error("the graph of %s could not be loaded again: %s", file.path, exc)
                continue
            log.info("the graph of %s (%d rows) loaded again", file.path, file.count)
            self.restarts += 1
            metrics.INDEX_GRAPH_HELPER_RESTARTS.inc()
            return
        # The caller hears why without the server's paths; the log has them.
        raise IndexLoadError("the index's graph is unavailable: its helper process did not start again")

    def grow(self, file: GraphFile, rows: int) -> None:
        """Adds `file`'s vectors from row `rows` on to the helper's graph (which must hold `rows`),
        at a lower CPU priority while the helper keeps answering; waits until they are in."""
        assert file.vectors is not None
        grower = self.running[-1] if self.running else None
        self.call(("grow", str(file.vectors), rows, file.count, BACKGROUND_NICE))
        deadline = time.monotonic() + self.ready_timeout_s
        state = "running"
        while state == "running":
            if time.monotonic() > deadline:
                raise IndexLoadError(f"its graph did not grow in {self.ready_timeout_s:.0f} s")
            time.sleep(_GROWTH_POLL_S)
            state = self.call(("growth",))
        with self.lock:
            if state != "done" or not self.running or self.running[-1] is not grower:
                raise IndexLoadError(f"its graph did not grow: {state}")
            self.files.append(file)


class GraphProcess:
    """A view of a graph served by a helper process: the rows of one version. A helper that dies is
    started again at the next search (which waits for the load); one search at a time, as
    hnswlib's index-wide ef needs anyway. `GraphProcess.open` grows the graph a served version's
    helper holds when the new version's graph extends it, so a reload holds one graph, not two."""

    def __init__(
        self, path: Path, dim: int, count: int, beside_requests: bool = False, ready_timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """`beside_requests`: requests are being served while it loads (a hot reload)."""
        file = GraphFile(path, dim, count, beside_requests)
        self._attach(_Helpers(file, ready_timeout_s), file)

    def _attach(self, helpers: _Helpers, file: GraphFile) -> None:
        self._helpers = helpers
        self._count = file.count
        # Closed explicitly, or when the version holding it is garbage-collected after a reload
        # or refused.
        self._finalizer = weakref.finalize(self, helpers.release, helpers.add_view(file))

    @classmethod
    def open(cls, file: GraphFile, ready_timeout_s: float = READY_TIMEOUT_S) -> GraphProcess:
        """`file`'s graph: the graph of the version it extends, grown, when a helper serves that
        version (docs/indexing.md, "grows the graph already served"); else loaded by a new helper."""
        graph = _grown(file)
        if graph is None:
            graph = cls(file.path, file.dim, file.count, file.beside_requests, ready_timeout_s)
        if file.version:
            _SERVED[file.version] = graph
        return graph

    @property
    def pid(self) -> int:
        return self._helpers.running[-1].proc.pid

    @property
    def restarts(self) -> int:
        return self._helpers.restarts

    @property
    def count(self) -> int:
        return self._count

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def knn(
        self, vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        packed = None if allowed is None else np.packbits(allowed)
        vector = np.ascontiguousarray(vector, dtype=np.float32)
        labels, distances = self._call(("knn", vector, k, ef, packed, self._count))
        return labels, distances

    def items(self, rows: np.ndarray) -> np.ndarray:
        vectors: np.ndarray = self._call(("items", np.asarray(rows, dtype=np.int64)))
        return vectors

    def close(self) -> None:
        self._finalizer()

    def _call(self, request: tuple[Any, ...]) -> Any:
        if self.closed:
            raise IndexLoadError("this index version's graph is closed")
        return self._helpers.call(request)


# The graphs helpers serve, by version identity: what a new version's graph may be grown from.
_SERVED: weakref.WeakValueDictionary[str, GraphProcess] = weakref.WeakValueDictionary()
_GROWTH_POLL_S = 0.1


def _grown(file: GraphFile) -> GraphProcess | None:
    if file.base is None or file.vectors is None:
        return None
    identity, rows = file.base
    base = _SERVED.get(identity)
    if base is None or base.closed or base.count != rows:
        return None
    helpers = base._helpers
    try:
        helpers.grow(file, rows)
    except (IndexLoadError, RuntimeError) as exc:
        log.warning("could not grow the graph of version %s in place (%s); loading %s's own", identity, exc, file.path)
        return None
    log.info("graph of version %s grown in place from %d to %d rows", identity, rows, file.count)
    graph = GraphProcess.__new__(GraphProcess)
    graph._attach(helpers, file)
    return graph


if __name__ == "__main__":  # the helper's command line names this module (operators and tests look for it)
    from ragserve.index.graph_helper import serve

    sys.exit(serve(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
