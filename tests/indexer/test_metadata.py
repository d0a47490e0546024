"""Metadata in: front matter, sidecars, BEIR `metadata`, derived fields; types checked at build time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.build import build_index
from indexer.loaders import Document
from indexer.metadata import MetadataError, choose_fields, parse_declared, split_front_matter
from indexer.sources import iter_source
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.filters import parse_filter
from ragserve.index.hnsw import HnswIndex
from ragserve.index.metadata import FIELDS_FILE, FieldColumns


def _docs(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_front_matter_is_metadata_and_not_text() -> None:
    meta, body = split_front_matter("---\nlang: en\ntags: [a, b]\nwhen: 2024-05-01\n---\n# Title\nBody.")
    assert meta["lang"] == "en" and meta["tags"] == ["a", "b"] and str(meta["when"]) == "2024-05-01"
    assert body == "# Title\nBody."
    assert split_front_matter("no front matter\n---\n") == ({}, "no front matter\n---\n")
    with pytest.raises(MetadataError, match="not YAML"):
        split_front_matter("---\nlang: [unclosed\n---\nbody")
    with pytest.raises(MetadataError, match="mapping"):
        split_front_matter("---\n- a list\n---\nbody")


def test_a_folder_gives_derived_fields_front_matter_and_sidecars(tmp_path: Path) -> None:
    src = _docs(
        tmp_path / "src",
        {
            "guides/setup.md": "---\ntitle: Setting up\nlang: en\n---\nInstall it and run it.",
            "notes.txt": "Plain notes about tides.",
            "notes.txt.meta.json": json.dumps({"lang": "de", "year": 2021}),
        },
    )
    docs = {d.doc_id: d for d in iter_source(src) if isinstance(d, Document)}
    assert set(docs) == {"guides/setup.md", "notes.txt"}  # the sidecar is no document
    setup = docs["guides/setup.md"]
    assert setup.title == "Setting up" and "title:" not in setup.text
    assert setup.metadata["lang"] == "en" and setup.metadata["folder"] == "guides"
    assert setup.metadata["file_type"] == "md" and setup.metadata["path"] == "guides/setup.md"
    assert docs["notes.txt"].metadata["lang"] == "de" and docs["notes.txt"].metadata["year"] == 2021
    assert "modified" in docs["notes.txt"].metadata


def test_an_author_cannot_move_a_document_for_a_filter(tmp_path: Path) -> None:
    """Round six: front matter or a sidecar naming a derived field does not change it."""
    planted = "---\nfolder: finance\npath: finance/q3.md\nfile_type: pdf\nmodified: 2001-01-01\n---\nText."
    src = _docs(
        tmp_path / "src",
        {"blog/post.md": planted, "blog/note.txt": "Note.", "blog/note.txt.meta.json": json.dumps({"folder": "hr"})},
    )
    docs = {d.doc_id: d for d in iter_source(src) if isinstance(d, Document)}
    post, note = docs["blog/post.md"].metadata, docs["blog/note.txt"].metadata
    assert (post["folder"], post["path"], post["file_type"]) == ("blog", "blog/post.md", "md")
    assert not str(post["modified"]).startswith("2001") and note["folder"] == "blog"


def test_a_beir_line_carries_its_metadata(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = [
        {"_id": "d1", "title": "One", "text": "first", "metadata": {"tenant": "acme", "tier": 2}},
        {"_id": "d2", "title": "Two", "text": "second", "metadata": "not an object"},
    ]
    corpus.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    items = list(iter_source(corpus))
    assert isinstance(items[0], Document) and items[0].metadata == {"title": "One", "tenant": "acme", "tier": 2}
    assert not isinstance(items[1], Document) and "metadata is not an object" in items[1].reason


def test_fields_share_one_type_or_are_declared() -> None:
    fields = choose_fields(
        [{"a": 1, "b": "x", "c": 1.5, "d": [1, 2]}, {"a": 2.5, "b": 3, "c": 2, "e": {"nested": 1}}],
        {"b": "keyword"},
    )
    assert dict(fields.schema) == {"a": "float", "b": "keyword", "c": "float", "d": "integer"}
    assert "objects" in fields.left_out["e"]
    mixed = choose_fields([{"x": 1}, {"x": "one"}], {})
    assert "x" not in mixed.schema and "--field x:" in mixed.left_out["x"]
    with pytest.raises(ValueError, match="--field"):
        parse_declared(["year:number"])


def test_a_value_of_the_wrong_type_skips_its_document_whole(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    src = _docs(
        tmp_path / "src",
        {"a.md": "---\nyear: 2020\n---\nAlpha text.", "b.md": "---\nyear: soon\n---\nBeta text."},
    )
    skipped: list[str] = []
    report = build_index(
        src,
        tmp_path / "idx",
        embedder,
        progress=False,
        on_skip=lambda s: skipped.append(f"{s.source}: {s.reason}"),
        declared_fields={"year": "integer"},
    )
    assert report.documents == 1
    assert skipped == ["b.md: metadata field 'year' is integer: 'soon' is not a finite number"]
    index = HnswIndex.load(tmp_path / "idx")
    assert index.fields["year"] == "integer"
    assert {c.doc_id for c in index.chunks} == {"a.md"}


def test_a_metadata_only_change_republishes_without_embedding(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    src = _docs(tmp_path / "src", {"a.md": "---\nlang: en\n---\nAlpha text.", "b.md": "Beta text."})
    root = tmp_path / "idx"
    first = build_index(src, root, embedder, progress=False)
    again = build_index(src, root, embedder, progress=False)
    assert not again.published  # nothing changed: no new version
    (src / "a.md").write_text("---\nlang: de\n---\nAlpha text.")
    stamp = (src / "b.md").stat()
    relabeled = build_index(src, root, embedder, progress=False)
    assert relabeled.published and relabeled.version == first.version + 1
    assert relabeled.embedded == 0 and relabeled.relabeled >= 1
    assert (src / "b.md").stat().st_mtime == stamp.st_mtime
    index = HnswIndex.load(root)
    assert {c.metadata.get("lang") for c in index.chunks if c.doc_id == "a.md"} == {"de"}


def test_a_build_stores_its_filter_columns_and_the_server_reads_them(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    src = _docs(
        tmp_path / "src",
        {
            "a.md": "---\nlang: en\nyear: 2021\n---\nAlpha text.",
            "b.md": "---\nlang: de\n---\nBeta text.",
            "c.md": "Gamma.",
        },
    )
    build_index(src, tmp_path / "idx", embedder, progress=False, declared_fields={"year": "integer"})
    index = HnswIndex.load(tmp_path / "idx")
    assert FIELDS_FILE in index.manifest.files  # listed, so verified by its checksum with the rest
    stored = FieldColumns.read(index.folder / FIELDS_FILE, index.count, index.fields)
    decoded = FieldColumns(index.chunks, index.fields)
    for raw in (
        {"must": [{"key": "lang", "match": {"value": "en"}}]},
        {"must": [{"key": "year", "range": {"gte": 2020}}]},
        {"must_not": [{"key": "lang", "exists": True}]},
    ):
        flt = parse_filter(raw, index.fields)
        assert flt is not None
        assert stored.mask(flt).tolist() == decoded.mask(flt).tolist()
        assert index.count_matching(flt) == int(decoded.mask(flt).sum()) >= 1
