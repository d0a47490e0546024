"""A hot reload of a version that only adds documents grows the graph the served version's helper
holds instead of loading a second one: the new version searches as its published file does, the
old one keeps to its own rows until it is let go, and a failed growth loads the file instead."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from indexer import host_share
from indexer.build import build_index
from indexer.chunking import ChunkingConfig
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import IndexLoadError
from ragserve.index.bm25 import Bm25Index
from ragserve.index.format import HNSW_FILE, Manifest, resolve_current
from ragserve.index.graph_helper import _answer, _Growth
from ragserve.index.graph_process import GraphProcess, _Helpers
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from ragserve.server.app import RagServer
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.index.conftest import reloading_settings, write_docs
from tests.index.test_graph_process import _gone
from tests.indexer.test_resume import SlowEmbedder

CHUNKING = ChunkingConfig(8, 0)


def _publish(source: Path, root: Path, docs: range) -> None:
    source.mkdir(exist_ok=True)
    for d in docs:
        (source / f"doc{d:03d}.txt").write_text(" ".join(f"w{d}x{i}" for i in range(24)))
    build_index(source, root, SlowEmbedder(), CHUNKING, progress=False)


@pytest.fixture
def grown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(old version, new version, root): the new one, published after the old was served, adds
    documents; the indexer extends the graph on one thread, as `ragserve-index build` does by default."""
    monkeypatch.setattr(host_share, "threads", 1)
    source, root = tmp_path / "docs", tmp_path / "index"
    _publish(source, root, range(60))
    old = HnswIndex.load(root, open_graph=GraphProcess.open)
    _publish(source, root, range(60, 75))
    new = FolderWatch(root, open_graph=GraphProcess.open).load()
    yield old, new, root
    for version in (old, new):
        version._graph.close()  # type: ignore[attr-defined]


def _queries(n: int) -> np.ndarray:
    vectors = np.random.default_rng(7).standard_normal((n, 8)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _hits(index: HnswIndex, query: np.ndarray, k: int = 10) -> list[tuple[str, float]]:
    return [(hit.chunk.chunk_id, round(hit.score, 5)) for hit in index.search(query, k, 64)]


def test_the_new_version_grows_the_served_graph_and_searches_as_its_file(grown) -> None:
    old, new, root = grown
    assert new.manifest.graph_base == {"identity": old.identity, "rows": old.count}
    assert new.count > old.count
    assert new._graph.pid == old._graph.pid  # one helper, one graph
    from_file = HnswIndex.load(root)  # the published file, in this process
    for query in _queries(20):
        assert _hits(new, query) == _hits(from_file, query)


def test_the_old_version_keeps_to_its_own_rows_while_the_graph_is_grown(grown) -> None:
    old, _, root = grown
    alone = HnswIndex.load(root.parent / "index", open_graph=GraphProcess.open)  # the new one, loaded whole
    for query in _queries(20):
        labels, _ = old._graph.knn(query, 10, 64)
        assert labels.max() < old.count
        assert all(hit.chunk.chunk_id in _old_ids(old) for hit in old.search(query, 10, 64))
        allowed = np.zeros(old.count, dtype=bool)
        allowed[::3] = True
        assert all(allowed[old._graph.knn(query, 5, 64, allowed)[0]])
    alone._graph.close()  # type: ignore[attr-defined]


def _old_ids(old: HnswIndex) -> set[str]:
    return {chunk.chunk_id for chunk in old.chunks}


def test_the_helper_stays_while_either_version_is_served(grown) -> None:
    old, new, _ = grown
    pid = old._graph.pid
    old._graph.close()
    with pytest.raises(IndexLoadError, match="closed"):
        old._graph.knn(_queries(1)[0], 3, 10)
    assert new.search(_queries(1)[0], 3, 64)
    new._graph.close()
    assert _gone(pid)


def test_after_a_growth_a_helper_that_dies_loads_the_grown_version_file(grown) -> None:
    old, new, root = grown
    pid = new._graph.pid
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    from_file = HnswIndex.load(root)
    for query in _queries(5):
        assert _hits(new, query) == _hits(from_file, query)
    assert new._graph.pid != pid and new._graph.restarts == 1
    assert old._graph.knn(_queries(1)[0], 10, 64)[0].max() < old.count


def test_a_growth_that_fails_loads_the_new_graph_in_a_helper_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(self: _Helpers, file: object, rows: int) -> None:
        raise IndexLoadError("its graph did not grow: the helper said no")

    monkeypatch.setattr(_Helpers, "grow", failing)
    source, root = tmp_path / "docs", tmp_path / "index"
    _publish(source, root, range(30))
    old = HnswIndex.load(root, open_graph=GraphProcess.open)
    _publish(source, root, range(30, 40))
    new = FolderWatch(root, open_graph=GraphProcess.open).load()
    assert new._graph.pid != old._graph.pid  # type: ignore[attr-defined]
    assert "could not grow" in caplog.text
    from_file = HnswIndex.load(root)
    assert _hits(new, _queries(1)[0]) == _hits(from_file, _queries(1)[0])
    for version in (old, new):
        version._graph.close()  # type: ignore[attr-defined]
    del old, new
    gc.collect()


def test_a_version_built_anew_is_loaded_not_grown(tmp_path: Path) -> None:
    source, root = tmp_path / "docs", tmp_path / "index"
    _publish(source, root, range(30))
    old = HnswIndex.load(root, open_graph=GraphProcess.open)
    (source / "doc000.txt").write_text("changed words here")  # a change: the graph is rebuilt
    build_index(source, root, SlowEmbedder(), CHUNKING, progress=False)
    new = FolderWatch(root, open_graph=GraphProcess.open).load()
    assert new.manifest.graph_base == {}
    assert new._graph.pid != old._graph.pid  # type: ignore[attr-defined]
    for version in (old, new):
        version._graph.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("base", "why"),
    [
        ({"identity": "xyz", "rows": 1}, "16 hex"),
        ({"identity": "0123456789abcdef"}, "16 hex"),
        ({"identity": "0123456789abcdef", "rows": 0}, "between 1 and the count"),
        ({"identity": "0123456789abcdef", "rows": 11}, "between 1 and the count"),
        ({"identity": "0123456789abcdef", "rows": True}, "between 1 and the count"),
    ],
)
def test_a_manifest_with_a_bad_graph_base_is_refused(base: dict[str, object], why: str) -> None:
    manifest = Manifest(version=2, embedder_id="e", dim=8, count=10, files={HNSW_FILE: "0" * 64}, graph_base=base)
    with pytest.raises(ValueError, match=why):
        Manifest.from_json(manifest.to_json())


def test_the_published_file_is_what_a_fresh_helper_loads(grown) -> None:
    _, new, root = grown
    fresh = GraphProcess(resolve_current(root) / HNSW_FILE, 8, new.count)
    for query in _queries(5):
        want, got = fresh.knn(query, 10, 64), new._graph.knn(query, 10, 64)
        assert got[0].tolist() == want[0].tolist()
    fresh.close()


@pytest.mark.slow  # a real server, the real embedder and child processes (CI runs it)
def test_through_the_real_server_a_reload_grows_the_graph_it_serves(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    asyncio.run(_grown_by_the_server(tmp_path, embedder))


async def _grown_by_the_server(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    build_index(docs, root, embedder, progress=False)
    settings = reloading_settings(root, graph_process_min_chunks=0)
    server = RagServer(settings)
    await server.start()
    try:
        helpers = _graph_helpers()
        assert len(helpers) == 1
        (docs / "eclipse.txt").write_text("Solar eclipse\nThe moon passes between the sun and the earth.")
        await asyncio.to_thread(build_index, docs, root, embedder, progress=False)
        for _ in range(600):
            if server.pipeline is not None and server.pipeline.index.version == "2":
                break
            await asyncio.sleep(0.05)
        assert server.pipeline is not None and server.pipeline.index.version == "2"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{settings.transport.port}") as channel:
            reply = await pb_grpc.RagServiceStub(channel).Retrieve(
                pb.RetrieveRequest(query="solar eclipse", top_k=1), timeout=30
            )
        assert reply.index_version == "2" and reply.passages[0].doc_id == "eclipse.txt"
        gc.collect()
        assert _graph_helpers() == helpers  # the same helper, one graph: grown, not loaded again
    finally:
        await server.shutdown()


def _graph_helpers() -> list[int]:
    children = psutil.Process().children(recursive=True)
    return [c.pid for c in children if "ragserve.index.graph_process" in " ".join(c.cmdline())]


def test_searches_while_rows_are_appended_keep_to_the_rows_asked_for(tmp_path: Path) -> None:
    """In the helper, the old version's searches run between the growth's appends (the threads
    themselves: tests/index/test_graph_turns.py)."""
    import hnswlib

    from ragserve.index.graph import LoadedGraph

    vectors = _queries(3000)
    index = hnswlib.Index(space="ip", dim=8)
    index.init_index(max_elements=2000, M=16, ef_construction=100, random_seed=1)
    index.add_items(vectors[:2000], np.arange(2000))
    graph = LoadedGraph(index)
    graph.make_room(3000)
    assert graph.capacity == 3000 and graph.count == 2000
    # From the moment there is room, the helper bounds a search of 2,000 rows, though none was added yet.
    asked: list[int | None] = []
    real_knn = graph.knn
    graph.knn = lambda v, k, ef, allowed=None, rows=None: asked.append(rows) or real_knn(v, k, ef, allowed, rows)  # type: ignore[method-assign]
    assert _answer(graph, _Growth(), ("knn", vectors[0], 5, 64, None, 2000))[0] == "ok"
    assert asked == [2000]
    graph.knn = real_knn  # type: ignore[method-assign]
    for first in range(2000, 3000, 50):
        graph.append(vectors[first : first + 50], first)
        for query in vectors[first : first + 50 : 5]:  # beside the rows just added
            labels, _ = graph.knn(query, 10, 64, rows=2000)
            assert len(labels) == 10 and labels.max() < 2000
    assert graph.count == 3000
    assert graph.knn(vectors[2999], 1, 64)[0][0] == 2999  # the new view finds the new rows


class _Refusing:
    """The served side of a reload that refuses the new version at its swap (its models do not
    load, say): after its graph was grown in place."""

    def __init__(self, index: HnswIndex) -> None:
        self.index = index

    def swap_index(self, index: object) -> None:
        raise IndexLoadError("its reranker does not load")

    def refused(self, reason: str) -> None:
        pass


def _served_then_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[HnswIndex, Path, list]:
    """(the served version, the root, its hits before) after a version grown from it was refused."""
    caplog.set_level(logging.INFO, "ragserve.index.graph_process")
    source, root = tmp_path / "docs", tmp_path / "index"
    _publish(source, root, range(60))
    old = HnswIndex.load(root, open_graph=GraphProcess.open)
    before = [_hits(old, query) for query in _queries(10)]
    _publish(source, root, range(60, 75))
    reloader = IndexReloader(FolderWatch(root, open_graph=GraphProcess.open), _Refusing(old))
    assert not reloader.check_once() and reloader.refused == 1
    assert "grown in place" in caplog.text
    gc.collect()
    return old, root, before


def test_a_version_grown_then_refused_leaves_the_served_search_working_after_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The refused version's folder goes (removed, or pruned by later builds), then the helper dies:
    its replacement loads the served version's file."""
    old, root, before = _served_then_refused(tmp_path, caplog)
    shutil.rmtree(resolve_current(root))
    pid = old._graph.pid  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    assert [_hits(old, query) for query in _queries(10)] == before
    assert old._graph.restarts == 1  # type: ignore[attr-defined]
    old._graph.close()  # type: ignore[attr-defined]


def test_with_the_served_folder_pruned_a_restart_loads_the_graph_grown_from_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two more builds prune the served version's own folder: the refused version's file holds its
    graph grown, which serves it as well."""
    old, root, _ = _served_then_refused(tmp_path, caplog)
    _publish(tmp_path / "docs", root, range(75, 80))
    assert not (root / old.source).exists()
    pid = old._graph.pid  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGKILL)
    assert _gone(pid)
    ids = _old_ids(old)
    for query in _queries(10):
        hits = _hits(old, query)
        assert len(hits) == 10 and all(chunk_id in ids for chunk_id, _ in hits)
    old._graph.close()  # type: ignore[attr-defined]


def test_a_version_refused_by_its_own_checks_lets_its_grown_graph_go_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ragserve.index.graph_process")
    source, root = tmp_path / "docs", tmp_path / "index"
    _publish(source, root, range(30))
    old = HnswIndex.load(root, open_graph=GraphProcess.open)
    _publish(source, root, range(30, 40))

    def broken(folder: Path, count: int) -> None:
        raise IndexLoadError("bm25 unreadable")

    monkeypatch.setattr(Bm25Index, "load", broken)
    with pytest.raises(IndexLoadError, match="bm25 unreadable"):
        FolderWatch(root, open_graph=GraphProcess.open).load()
    assert "grown in place" in caplog.text
    assert list(old._graph._helpers.views.values()) == [old._graph._helpers.files[0]]  # type: ignore[attr-defined]
    old._graph.close()  # type: ignore[attr-defined]
