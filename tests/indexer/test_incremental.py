"""A second build over the same tree re-embeds only changed documents and drops deleted ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from indexer.build import build_index
from indexer.embedding import LazyEmbedder
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.index.chunk_store import chunk_record, decode_chunk
from ragserve.index.format import CURRENT, VECTORS_FILE, resolve_current
from ragserve.index.hnsw import HnswIndex
from ragserve.request.sentences import analyse_text
from tests.index.conftest import write_docs


class SpyEmbedder:
    """The real embedder, recording which texts it was asked to embed."""

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner = inner
        self.texts: list[str] = []

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed_documents(texts, batch_size)


def test_second_run_touches_only_changed_files(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    spy = SpyEmbedder(embedder)
    first = build_index(docs, root, spy, progress=False)
    assert (first.embedded, first.reused, first.removed) == (5, 0, 0)
    v1_vectors = np.load(resolve_current(root) / VECTORS_FILE)

    (docs / "tides.txt").write_text("Tides\nSpring tides happen when the sun and the moon line up.")  # changed
    (docs / "gamma.txt").unlink()  # deleted
    (docs / "delta.txt").write_text("Delta waves\nDelta waves are slow brain waves seen in deep sleep.")  # new
    spy.texts.clear()
    second = build_index(docs, root, spy, progress=False)

    assert (second.embedded, second.reused, second.removed) == (2, 3, 1)
    assert second.version == 2
    embedded = "\n".join(spy.texts)
    assert "Spring tides" in embedded and "Delta waves" in embedded
    for untouched in ("helium-4", "positron", "wild yeast"):
        assert untouched not in embedded

    index = HnswIndex.load(root)
    doc_ids = {h.chunk.doc_id for h in index.search(v1_vectors[0], k=index.count, ef=64)}
    assert doc_ids == {"alpha.txt", "beta.md", "tides.txt", "sourdough.md", "delta.txt"}
    # Reused vectors are carried over unchanged, and search and BM25 see the new text.
    vector = embedder.embed_queries(["slow brain waves in deep sleep"])[0]
    assert index.search(vector, k=1, ef=64)[0].chunk.doc_id == "delta.txt"
    assert index.search_lexical("spring tides sun moon", 1)[0].chunk.doc_id == "tides.txt"
    assert all(h.chunk.doc_id != "gamma.txt" for h in index.search_lexical("gamma photons excited relaxes", 10))


def test_unchanged_tree_publishes_nothing(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    build_index(docs, root, embedder, progress=False)
    before = (root / CURRENT).resolve()
    spy = SpyEmbedder(embedder)
    again = build_index(docs, root, spy, progress=False)
    assert not again.published and again.embedded == 0 and again.reused == 5
    assert spy.texts == []
    assert (root / CURRENT).resolve() == before
    # As the CLI runs it: the model is never loaded for a tree with nothing new.
    loads: list[str] = []
    lazy = LazyEmbedder(embedder.model_id, lambda: loads.append("loaded") or embedder)  # type: ignore[func-returns-value]
    assert not build_index(docs, root, lazy, progress=False).published and loads == []


def test_a_lazy_embedder_loads_once_and_checks_the_id_it_was_given(embedder: SentenceTransformerEmbedder) -> None:
    loads: list[str] = []
    lazy = LazyEmbedder(embedder.model_id, lambda: loads.append("loaded") or embedder)  # type: ignore[func-returns-value]
    assert lazy.dim == embedder.dim and lazy.embed_documents(["a text"]).shape == (1, embedder.dim)
    assert loads == ["loaded"]
    with pytest.raises(ValueError, match="expected 'another-model'"):
        _ = LazyEmbedder("another-model", lambda: embedder).tokenizer


def test_full_rebuild_when_chunking_changes(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> None:
    from indexer.chunking import ChunkingConfig

    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    build_index(docs, root, embedder, progress=False)
    other = build_index(docs, root, embedder, ChunkingConfig(64, 8), progress=False)
    assert other.embedded == 5 and other.reused == 0 and other.version == 2


def test_added_documents_extend_the_previous_graph_and_others_rebuild_it(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    first = build_index(docs, root, embedder, progress=False)
    before = HnswIndex.load(root)
    old_rows = [(c.chunk_id, c.text) for c in before.chunks]
    assert not first.graph_extended

    # An added file sorts between the others: the new version keeps the old rows first, as they were.
    (docs / "bravo.txt").write_text("Bravo\nA bravo is a cheer of approval shouted at the end of a show.")
    added = build_index(docs, root, embedder, progress=False)
    index = HnswIndex.load(root)
    assert added.graph_extended and (added.embedded, added.reused) == (1, 5)
    assert [(c.chunk_id, c.text) for c in index.chunks][: len(old_rows)] == old_rows
    vector = embedder.embed_queries(["a cheer of approval at the end of a show"])[0]
    assert index.search(vector, k=1, ef=64)[0].chunk.doc_id == "bravo.txt"
    assert index.manifest.hnsw["ef_search"] >= 0

    (docs / "gamma.txt").unlink()  # a removal cannot extend: rows would shift
    removed = build_index(docs, root, embedder, progress=False)
    assert not removed.graph_extended and removed.removed == 1
    assert "gamma.txt" not in {c.doc_id for c in HnswIndex.load(root).chunks}


def _records(root: Path) -> dict[str, dict]:
    lines = (resolve_current(root) / "chunks.jsonl").read_bytes().splitlines()
    return {r["chunk_id"]: r for r in map(orjson.loads, lines)}


def test_kept_chunks_keep_their_stored_sentences_and_changed_ones_are_analysed_again(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    build_index(docs, root, embedder, progress=False)
    before = _records(root)
    # Same file, same chunk ids, new text: sentences kept by chunk id would be the old text's.
    (docs / "tides.txt").write_text("Tides\nSpring tides happen when the sun and the moon line up. They are strong.")
    build_index(docs, root, embedder, progress=False)
    after = _records(root)

    changed = [cid for cid, r in after.items() if before.get(cid, {}).get("text") != r["text"]]
    assert changed, "the edited document's chunks have new text"
    for cid, record in after.items():
        expected = before[cid]["sentences"] if cid not in changed else None
        if expected is None:  # analysed for this text, as a new chunk is
            chunk = decode_chunk(orjson.dumps({k: v for k, v in record.items() if k != "sentences"}), "test")
            expected = orjson.loads(chunk_record(chunk, analyse_text(chunk.text)))["sentences"]
        assert record["sentences"] == expected, cid
