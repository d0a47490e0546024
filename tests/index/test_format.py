from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from indexer.build import build_index
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import IndexLoadError
from ragserve.factory import assemble_pipeline
from ragserve.index.format import CHUNKS_FILE, CURRENT, HNSW_FILE, MANIFEST, resolve_current
from ragserve.index.hnsw import HnswIndex
from tests.conftest import SAMPLE_DOCS


def test_search_finds_the_right_document(sample_index: Path, embedder: SentenceTransformerEmbedder) -> None:
    index = HnswIndex.load(sample_index)
    assert index.embedder_id == embedder.model_id
    assert index.count > 32  # several chunks per document
    vector = embedder.embed_queries(["How many bits per element does a Bloom filter need?"])[0]
    hits = index.search(vector, k=3, ef=64)
    assert hits[0].chunk.doc_id == "bloom-filters.txt"
    assert hits[0].score >= hits[1].score >= hits[2].score


def test_doc_ids_are_paths_relative_to_the_root(sample_index: Path) -> None:
    index = HnswIndex.load(sample_index)
    doc_ids = {hit.chunk.doc_id for hit in index.search(index_vector(index), k=index.count, ef=index.count)}
    assert doc_ids == {p.name for p in SAMPLE_DOCS.iterdir() if p.suffix in {".md", ".txt", ".html", ".pdf"}}


def index_vector(index: HnswIndex):  # any unit vector of the right size
    import numpy as np

    v = np.ones(index.dim, dtype=np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture
def index_copy(sample_index: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(sample_index, target, symlinks=True)
    return target


@pytest.mark.parametrize("victim", [HNSW_FILE, CHUNKS_FILE])
def test_corrupt_file_is_refused(index_copy: Path, victim: str) -> None:
    path = resolve_current(index_copy) / victim
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(IndexLoadError, match="checksum"):
        HnswIndex.load(index_copy)


def test_corrupt_manifest_is_refused(index_copy: Path) -> None:
    (resolve_current(index_copy) / MANIFEST).write_text("{not json")
    with pytest.raises(IndexLoadError, match="corrupt"):
        HnswIndex.load(index_copy)


def test_missing_index_has_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IndexLoadError, match="run the indexer"):
        HnswIndex.load(tmp_path / "nothing-here")


def test_republish_bumps_version_and_flips_current(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Alpha document\nThe alpha particle is a helium nucleus.")
    root = tmp_path / "idx"
    first = build_index(docs, root, embedder, progress=False)
    (docs / "b.md").write_text("# Beta\nBeta decay emits an electron or a positron.")
    second = build_index(docs, root, embedder, progress=False)
    assert (first.version, second.version) == (1, 2)
    assert (root / CURRENT).resolve() == second.folder
    loaded = HnswIndex.load(root)
    assert loaded.version == "2"
    assert loaded.manifest.documents == 2
    assert not list(root.glob(".build-*"))


def test_index_from_before_bm25_still_loads_dense_only(index_copy: Path, embedder: SentenceTransformerEmbedder) -> None:
    """A version written by the first release (no bm25/, vectors or hashes) loads and serves dense-only."""
    import json

    from ragserve.index.fusion import RetrievalOptions, effective_mode, hybrid_search, plan_breadth

    folder = resolve_current(index_copy)
    data = json.loads((folder / MANIFEST).read_text())
    for key in ("bm25", "embedder_backend"):
        data.pop(key)
    data["files"] = {name: digest for name, digest in data["files"].items() if name in (HNSW_FILE, CHUNKS_FILE)}
    (folder / MANIFEST).write_text(json.dumps(data))
    shutil.rmtree(folder / "bm25")
    index = HnswIndex.load(index_copy)
    assert not index.lexical_available
    vector = embedder.embed_queries(["Bloom filter false positives"])[0]
    opts = RetrievalOptions(mode="hybrid")
    ran = effective_mode(index, opts)
    hits = hybrid_search(
        index, "Bloom filter false positives", vector, plan_breadth(opts, ran, 3, 64, False), opts, ran
    )
    assert ran == "dense" and hits[0].chunk.doc_id == "bloom-filters.txt"
    # Through the pipeline the fallback is reported to the caller, and it cut nothing short.
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from ragserve.budget import Deadline, RequestContext
    from ragserve.types import RetrieveParams

    with ThreadPoolExecutor(1) as executor:
        pipeline = assemble_pipeline(embedder, index, None, executor, retrieval=opts)
        result = asyncio.run(
            pipeline.retrieve(
                RetrieveParams("Bloom filter false positives", 3, 10_000), RequestContext(Deadline(10_000))
            )
        )
    assert result.passages[0].chunk.doc_id == "bloom-filters.txt"
    assert any("dense-only" in remark for remark in result.degraded.remarks)
    assert not result.degraded.is_degraded()


def test_bm25_file_is_checksummed(index_copy: Path) -> None:
    path = resolve_current(index_copy) / "bm25" / "data.csc.index.npy"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(IndexLoadError, match="checksum"):
        HnswIndex.load(index_copy)
