"""`fetch` (request/readable.py) cannot tell an ungranted document from an unknown one, by what it
returns or by its time: the index checks the grant before it reads a chunk, so no chunk outside
the grant is read or decoded, on either backend; the id map is built once, however many first
fetches arrive together."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from indexer.build import build_index
from indexer.chunking import ChunkingConfig
from indexer.qdrant_publish import publish_folder_to_qdrant
from ragserve.access import AccessPolicy
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.index.base import SearchIndex
from ragserve.index.chunk_rows import ChunkRows
from ragserve.index.hnsw import HnswIndex
from ragserve.index.qdrant_index import QdrantIndex, make_client
from ragserve.request.readable import readable_chunks
from ragserve.types import Chunk

SECRET_DOC, UNKNOWN_DOC = "secret-plans.md", "no-such-plans.md"
POLICY = AccessPolicy(field="groups", grants={"alice": ("secret",)})
BOB, ALICE = POLICY.grant_for({"bob"}), POLICY.grant_for({"alice"})
# Small chunks keep the build quick; the secret document still makes about 100 of them.
CHUNKING = ChunkingConfig(size_tokens=16, overlap_tokens=0)


@pytest.fixture(scope="module")
def access_root(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    root = tmp_path_factory.mktemp("fetch")
    docs = root / "docs"
    docs.mkdir()
    words = " ".join(f"harbour ledger {n}." for n in range(400))
    (docs / SECRET_DOC).write_text(f"---\ngroups: [secret]\n---\n# Secret plans\n\n{words}")
    (docs / "public.md").write_text("---\ngroups: [public]\n---\n# Public notes\n\nTides follow the moon.")
    build_index(docs, root / "idx", embedder, chunking=CHUNKING, progress=False)
    return root / "idx"


@pytest.fixture(params=["hnsw", "qdrant-memory"])
def index(request: pytest.FixtureRequest, access_root: Path) -> Iterator[SearchIndex]:
    if request.param == "hnsw":
        yield HnswIndex.load(access_root)
        return
    client = make_client(":memory:", None, 10)
    publish_folder_to_qdrant(client, "fetch", access_root)
    yield QdrantIndex.open(client, "fetch")
    client.close()


def test_an_ungranted_document_reads_as_an_unknown_one(index: SearchIndex) -> None:
    secret = readable_chunks(index, "", SECRET_DOC, ALICE)
    assert 90 <= len(secret) <= 120
    assert [c.chunk_id for c in secret] == [f"{SECRET_DOC}#{n}" for n in range(len(secret))]
    for chunk_id, doc_id in (("", SECRET_DOC), (f"{SECRET_DOC}#5", ""), ("", UNKNOWN_DOC), (f"{UNKNOWN_DOC}#5", "")):
        assert readable_chunks(index, chunk_id, doc_id, BOB) == []
    public = readable_chunks(index, "", "public.md", BOB)
    assert [c.chunk_id for c in public] == ["public.md#0"]
    assert index.chunks_by_id([f"{SECRET_DOC}#1", "public.md#0", f"{SECRET_DOC}#0"], BOB) == public


class CountingRows(Sequence[Chunk]):
    """The docstore, counting the rows read (each read decodes one)."""

    def __init__(self, rows: Sequence[Chunk]) -> None:
        self.rows, self.read = rows, 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, row: Any) -> Any:
        self.read += 1
        return self.rows[row]


def test_hnsw_reads_no_chunk_outside_the_grant(access_root: Path) -> None:
    index = HnswIndex.load(access_root)
    index.chunks_by_id(["warm-up#0"])  # the id map is built once, here (it may read rows)
    spy = CountingRows(index._chunks)
    index._chunks = spy
    assert readable_chunks(index, "", SECRET_DOC, BOB) == []
    assert readable_chunks(index, f"{SECRET_DOC}#7", "", BOB) == []
    assert spy.read == 0
    assert len(readable_chunks(index, "", SECRET_DOC, ALICE)) == spy.read > 0


def test_qdrant_sends_no_point_outside_the_grant(access_root: Path) -> None:
    client = make_client(":memory:", None, 10)
    publish_folder_to_qdrant(client, "fetch", access_root)
    index = QdrantIndex.open(client, "fetch")
    sent: list[int] = []
    scroll = client.scroll

    def counted(*args: Any, **kwargs: Any) -> Any:
        points, offset = scroll(*args, **kwargs)
        sent.append(len(points))
        return points, offset

    client.scroll = counted
    assert readable_chunks(index, "", SECRET_DOC, BOB) == []
    assert readable_chunks(index, f"{SECRET_DOC}#7", "", BOB) == []
    assert sent == [0, 0]
    client.close()


def test_concurrent_first_fetches_build_the_id_map_once(access_root: Path, monkeypatch) -> None:
    index = HnswIndex.load(access_root)
    built: list[int] = []
    real = ChunkRows._from_records

    def slow(self: ChunkRows) -> dict[str, int]:
        built.append(1)
        time.sleep(0.2)
        return real(self)

    monkeypatch.setattr(ChunkRows, "_from_records", slow)
    found: list[int] = []
    threads = [
        threading.Thread(target=lambda: found.append(len(readable_chunks(index, "", SECRET_DOC, ALICE))))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and len(set(found)) == 1 and found[0] > 0


def _median_ratio(first: Callable[[], object], second: Callable[[], object], pairs: int = 200) -> float:
    times: list[list[float]] = [[], []]
    for n in range(pairs + 20):
        order = [(0, first), (1, second)] if n % 2 == 0 else [(1, second), (0, first)]
        for slot, call in order:
            started = time.perf_counter()
            call()
            if n >= 20:  # the first calls warm caches (the grant's mask, the id map)
                times[slot].append(time.perf_counter() - started)
    return statistics.median(times[0]) / statistics.median(times[1])


def test_an_ungranted_fetch_takes_the_time_of_an_unknown_one(access_root: Path) -> None:
    """A tolerant bound (benchmarks/bench_fetch.py measures it, BENCHMARKS.md): reading and
    decoding the document's chunks first made the ungranted fetch some 30 times slower."""
    index = HnswIndex.load(access_root)
    document = _median_ratio(
        lambda: readable_chunks(index, "", SECRET_DOC, BOB), lambda: readable_chunks(index, "", UNKNOWN_DOC, BOB)
    )
    chunk = _median_ratio(
        lambda: readable_chunks(index, f"{SECRET_DOC}#50", "", BOB),
        lambda: readable_chunks(index, f"{UNKNOWN_DOC}#50", "", BOB),
    )
    assert 1 / 1.5 < document < 1.5 and 1 / 1.5 < chunk < 1.5, (document, chunk)
