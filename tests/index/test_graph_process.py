"""The HNSW graph in a helper process answers as the graph in process does, is loaded again when
its process dies, goes away with its version, and refuses a graph it cannot load."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from ragserve.config import Settings
from ragserve.errors import IndexLoadError
from ragserve.factory.parts import make_graph_opener
from ragserve.index.format import HNSW_FILE, resolve_current
from ragserve.index.graph import GraphFile, LoadedGraph, load_graph
from ragserve.index.graph_process import GraphProcess
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch
from tests.index.tiny import DIM, publish_tiny, unit_vectors

TEXTS = [f"passage {i} about {'tides' if i % 3 else 'yeast'}" for i in range(300)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("graph-process")
    publish_tiny(folder, TEXTS, seed=3)
    return folder


@pytest.fixture(scope="module")
def graphs(root: Path):
    path = resolve_current(root) / HNSW_FILE
    helper = GraphProcess(path, DIM, len(TEXTS))
    yield load_graph(path, DIM, len(TEXTS)), helper
    helper.close()


def _gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # reaped by its own thread; if not yet, a zombie still answers kill(0)
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_the_helper_answers_what_the_graph_in_process_answers(graphs: tuple[LoadedGraph, GraphProcess]) -> None:
    local, helper = graphs
    assert helper.count == local.count == len(TEXTS)
    for seed in range(5):
        query = unit_vectors(1, 100 + seed)[0]
        for k, ef in ((1, 10), (10, 64), (50, 50)):
            want, got = local.knn(query, k, ef), helper.knn(query, k, ef)
            assert got[0].tolist() == want[0].tolist()
            np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    rows = np.array([5, 0, 299])
    np.testing.assert_array_equal(helper.items(rows), local.items(rows))


def test_a_filtered_walk_keeps_to_the_allowed_rows_and_says_when_too_few_pass(
    graphs: tuple[LoadedGraph, GraphProcess],
) -> None:
    local, helper = graphs
    allowed = np.zeros(len(TEXTS), dtype=bool)
    allowed[::7] = True
    query = unit_vectors(1, 9)[0]
    labels, _ = helper.knn(query, 5, 100, allowed)
    assert labels.tolist() == local.knn(query, 5, 100, allowed)[0].tolist()
    assert all(allowed[labels])
    few = np.zeros(len(TEXTS), dtype=bool)
    few[[1, 2]] = True
    with pytest.raises(RuntimeError):  # as hnswlib raises it: the index falls back to a scan
        helper.knn(query, 5, 100, few)


def test_an_index_over_the_helper_searches_as_one_in_process(root: Path) -> None:
    local = HnswIndex.load(root)
    remote = HnswIndex.load(root, open_graph=GraphProcess.open)
    for seed in range(3):
        query = unit_vectors(1, 40 + seed)[0]
        want = [(c.chunk.chunk_id, round(c.score, 5)) for c in local.search(query, 10, 64)]
        assert [(c.chunk.chunk_id, round(c.score, 5)) for c in remote.search(query, 10, 64)] == want


def test_a_helper_that_dies_is_loaded_again_at_the_next_search(
    root: Path, graphs: tuple[LoadedGraph, GraphProcess], caplog: pytest.LogCaptureFixture
) -> None:
    local = graphs[0]
    helper = GraphProcess(resolve_current(root) / HNSW_FILE, DIM, len(TEXTS))
    first = helper.pid
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    query = unit_vectors(1, 5)[0]
    assert helper.knn(query, 10, 64)[0].tolist() == local.knn(query, 10, 64)[0].tolist()
    assert helper.pid != first and helper.restarts == 1
    assert "is gone" in caplog.text
    helper.close()


def test_the_helper_exits_when_its_version_is_let_go(root: Path) -> None:
    index = HnswIndex.load(root, open_graph=GraphProcess.open)
    pid = index._graph.pid  # type: ignore[attr-defined]
    del index
    gc.collect()
    assert _gone(pid)


def test_a_closed_graph_refuses_searches(root: Path) -> None:
    helper = GraphProcess(resolve_current(root) / HNSW_FILE, DIM, len(TEXTS))
    pid = helper.pid
    helper.close()
    assert _gone(pid)
    with pytest.raises(IndexLoadError, match="closed"):
        helper.knn(unit_vectors(1, 1)[0], 1, 10)


def test_a_graph_the_helper_cannot_load_is_refused_with_its_reason(tmp_path: Path) -> None:
    bad = tmp_path / "hnsw.bin"
    bad.write_bytes(b"\0" * 64)
    with pytest.raises(IndexLoadError, match="is not a valid HNSW graph: 64 bytes"):  # checked in the helper
        GraphProcess(bad, DIM, 10)


def test_the_factory_moves_graphs_from_the_threshold_up(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = resolve_current(root) / HNSW_FILE
    monkeypatch.setenv("RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS", str(len(TEXTS) + 1))
    assert isinstance(make_graph_opener(Settings())(GraphFile(path, DIM, len(TEXTS))), LoadedGraph)
    monkeypatch.setenv("RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS", str(len(TEXTS)))
    helper = make_graph_opener(Settings())(GraphFile(path, DIM, len(TEXTS)))
    assert isinstance(helper, GraphProcess)
    helper.close()


def test_a_hot_reload_swaps_helpers_and_the_old_one_exits(tmp_path: Path) -> None:
    publish_tiny(tmp_path, TEXTS[:100], seed=1)
    watch = FolderWatch(tmp_path, open_graph=GraphProcess.open)
    old = watch.load()
    old_pid = old._graph.pid  # type: ignore[attr-defined]
    publish_tiny(tmp_path, TEXTS[:120], seed=2)
    new = watch.load()
    assert new.count == 120 and new._graph.pid != old_pid  # type: ignore[attr-defined]
    del old
    gc.collect()
    assert _gone(old_pid)
    new._graph.close()  # type: ignore[attr-defined]


def test_the_helper_outlives_a_signal_to_the_process_group_and_follows_the_server(root: Path) -> None:
    """Ctrl-C or a service manager's SIGTERM reach every process of the group: the helper stays
    for the server's drain, and goes when the server lets go of it."""
    helper = GraphProcess(resolve_current(root) / HNSW_FILE, DIM, len(TEXTS))
    pid = helper.pid
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(pid, sig)
    time.sleep(0.3)
    assert helper.knn(unit_vectors(1, 3)[0], 3, 10)[0].size == 3 and helper.pid == pid
    helper.close()
    assert _gone(pid)


def test_a_hung_helper_is_replaced_after_the_answer_timeout(
    root: Path, graphs: tuple[LoadedGraph, GraphProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ragserve.index.graph_process.ANSWER_TIMEOUT_S", 0.5)
    helper = GraphProcess(resolve_current(root) / HNSW_FILE, DIM, len(TEXTS))
    hung = helper.pid
    os.kill(hung, signal.SIGSTOP)  # alive, and silent
    query = unit_vectors(1, 8)[0]
    assert helper.knn(query, 4, 20)[0].tolist() == graphs[0].knn(query, 4, 20)[0].tolist()
    assert helper.pid != hung and helper.restarts == 1
    assert _gone(hung)
    helper.close()


def test_beside_requests_the_helper_loads_lower_and_searches_at_its_normal_priority(root: Path) -> None:
    helper = GraphProcess(resolve_current(root) / HNSW_FILE, DIM, len(TEXTS), beside_requests=True)
    assert psutil.Process(helper.pid).nice() == psutil.Process().nice()  # its searching thread
    assert helper.knn(unit_vectors(1, 2)[0], 3, 10)[0].size == 3
    helper.close()


def test_a_helper_that_cannot_be_started_again_fails_the_search_and_the_next_one_tries_again(
    root: Path, tmp_path: Path
) -> None:
    path = tmp_path / HNSW_FILE
    shutil.copy(resolve_current(root) / HNSW_FILE, path)
    helper = GraphProcess(path, DIM, len(TEXTS))
    os.kill(helper.pid, signal.SIGKILL)
    path.rename(tmp_path / "away")
    query = unit_vectors(1, 4)[0]
    with pytest.raises(IndexLoadError, match="unavailable") as caught:
        helper.knn(query, 3, 10)
    assert str(tmp_path) not in str(caught.value)  # a caller sees no server path
    (tmp_path / "away").rename(path)
    assert helper.knn(query, 3, 10)[0].size == 3
    helper.close()


def test_the_helper_gets_no_secret_of_the_servers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's token, API keys file, Qdrant key (any RAGSERVE_*, any other variable) stay in
    the server; Python's own and the thread settings pass."""
    from ragserve.index.graph_process import _child_env

    secrets = ("RAGSERVE_AUTH_TOKEN", "RAGSERVE_QDRANT_API_KEY", "AWS_SECRET_ACCESS_KEY")
    for name in secrets:
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    env = _child_env()
    assert not set(secrets) & set(env)
    assert env["OMP_NUM_THREADS"] == "2" and env["PATH"] == os.environ["PATH"] and env["PYTHONPATH"]
