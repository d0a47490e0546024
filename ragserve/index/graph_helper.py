"""The graph's helper process (graph_process.py starts it as `python -m ragserve.index.graph_process`):
it loads the graph at a lower priority, says it is ready, then answers one request at a time over
its socket (a search, rows by id, growing the graph from a version's vectors file, the growth's
state) until it is told to exit, its socket closes, or the serving process is gone."""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.errors import IndexLoadError
from ragserve.index.graph import LoadedGraph, load_graph
from ragserve.index.vector_file import VectorFile
from ragserve.priority import at_lower_priority, start_at_lower_priority


def _answer(graph: LoadedGraph, growth: _Growth, request: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        if request[0] == "knn":
            _, vector, k, ef, packed, rows = request
            allowed = None if packed is None else np.unpackbits(packed, count=rows).view(bool)
            if rows > graph.capacity:  # loaded again from a smaller version's file
                return "error", f"the graph holds {graph.capacity} rows, not {rows}"
            # A graph with room for more rows than the view's may be growing: keep to the view's.
            return "ok", graph.knn(vector, k, ef, allowed, rows if rows < graph.capacity else None)
        if request[0] == "items":
            return "ok", graph.items(request[1])
        if request[0] == "grow":
            return growth.start(graph, Path(request[1]), request[2], request[3], request[4])
        if request[0] == "growth":
            return "ok", growth.state
        return "error", f"unknown request {request[0]!r}"
    except RuntimeError as exc:  # hnswlib: fewer than k pass the filter
        return "runtime", str(exc)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


class _Growth:
    """The graph growing on a thread of its own: "none", "running", "done" or why it failed."""

    def __init__(self) -> None:
        self.state = "none"

    def start(self, graph: LoadedGraph, vectors: Path, rows: int, count: int, nice: int) -> tuple[str, Any]:
        if self.state == "running":
            return "error", "the graph is growing already"
        if graph.count != rows:
            return "error", f"the graph holds {graph.count} rows, not {rows}"
        graph.make_room(count)  # before the thread starts: nothing searches meanwhile
        self.state = "running"
        start_at_lower_priority(lambda: self._grow(graph, vectors, count), nice)
        return "ok", None

    def _grow(self, graph: LoadedGraph, path: Path, count: int) -> None:
        try:
            with VectorFile(path) as vectors:
                if vectors.shape != (count, graph.dim):
                    raise IndexLoadError(f"{path} has shape {vectors.shape}, not {(count, graph.dim)}")
                for first, slab in vectors.slabs(start=graph.count):
                    graph.append(slab, first)
            self.state = "done"
        except Exception as exc:
            self.state = f"{type(exc).__name__}: {exc}"


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
    growth = _Growth()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return 0
        if request[0] == "exit":
            return 0
        conn.send(_answer(graph, growth, request))
