"""A version's filter columns as the indexer stores them: read back, they mask exactly as columns
decoded from the chunks do; a file that does not fit its version is refused at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragserve.errors import IndexLoadError
from ragserve.filters import matches, parse_filter
from ragserve.index.metadata import FieldColumns
from ragserve.types import Chunk

SCHEMA = {"lang": "keyword", "year": "integer", "score": "float", "draft": "bool", "published": "datetime"}
FILTERS = [
    {"must": [{"key": "lang", "match": {"value": "en"}}]},
    {"must": [{"key": "lang", "match": {"any": ["de", "fr"]}}, {"key": "year", "range": {"gte": 2020}}]},
    {"should": [{"key": "draft", "match": {"value": True}}, {"key": "score", "range": {"lt": 0.5}}]},
    {"must_not": [{"key": "year", "exists": True}]},
    {
        "must": [{"key": "published", "range": {"gte": "2024-01-01"}}],
        "must_not": [{"key": "lang", "match": {"value": "en"}}],
    },
    {"must": [{"key": "year", "match": {"value": 2021}}]},
]


def _chunks(count: int = 400, seed: int = 3) -> list[Chunk]:
    rng = np.random.default_rng(seed)
    chunks = []
    for i in range(count):
        meta: dict[str, object] = {"lang": ["en", "de", "fr", ["en", "de"]][i % 4]}
        if i % 3:
            meta["year"] = int(2015 + rng.integers(0, 10))
        if i % 5:
            meta["score"] = float(rng.random())
        meta["draft"] = bool(i % 2)
        if i % 7:
            meta["published"] = f"202{i % 6}-0{1 + i % 9}-15T00:00:00+00:00"
        chunks.append(Chunk(f"c{i}", f"d{i}", f"text {i}", metadata=meta))
    return chunks


def test_stored_columns_mask_as_columns_decoded_from_the_chunks(tmp_path: Path) -> None:
    chunks = _chunks()
    decoded = FieldColumns(chunks, SCHEMA)
    decoded.write(tmp_path / "fields.npz")
    stored = FieldColumns.read(tmp_path / "fields.npz", len(chunks), SCHEMA)
    for raw in FILTERS:
        flt = parse_filter(raw, SCHEMA)
        assert flt is not None
        want = [matches(flt, c.metadata, SCHEMA) for c in chunks]
        assert decoded.mask(flt).tolist() == want
        assert stored.mask(flt).tolist() == want, raw


def _rewritten(tmp_path: Path, change) -> Path:
    chunks = _chunks(50)
    FieldColumns(chunks, SCHEMA).write(tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as archive:
        arrays = {key: archive[key] for key in archive.files}
    change(arrays)
    bad = tmp_path / "bad.npz"
    with bad.open("wb") as handle:
        np.savez(handle, **arrays)
    return bad


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda a: a["0.rows"].__setitem__(0, 50), "out of range"),  # row 50 of 50 chunks
        (lambda a: a["2.present"].__setitem__(0, -1), "out of range"),
        (lambda a: a.__setitem__("1.rows", a["1.rows"].astype(np.int32)), "int64"),
        (lambda a: a.__setitem__("0.offsets", a["0.offsets"][::-1].copy()), "out of order"),
        (lambda a: a.__setitem__("4.range_numbers", a["4.range_numbers"][:-1]), "do not match"),
        (lambda a: a.pop("3.present"), "3.present"),
        (lambda a: a.__setitem__("0.rows", np.array(["x"], dtype=object)), "not a valid columns file"),
    ],
)
def test_a_columns_file_that_does_not_fit_is_refused(tmp_path: Path, change, words: str) -> None:
    with pytest.raises(IndexLoadError, match=words):
        FieldColumns.read(_rewritten(tmp_path, change), 50, SCHEMA)


def test_columns_of_another_version_are_refused(tmp_path: Path) -> None:
    FieldColumns(_chunks(50), SCHEMA).write(tmp_path / "fields.npz")
    with pytest.raises(IndexLoadError, match="another version"):
        FieldColumns.read(tmp_path / "fields.npz", 51, SCHEMA)
    with pytest.raises(IndexLoadError, match="another version"):
        FieldColumns.read(tmp_path / "fields.npz", 50, {**SCHEMA, "tenant": "keyword"})


def test_a_compressed_or_broken_archive_is_refused(tmp_path: Path) -> None:
    import zipfile

    good = tmp_path / "good.npz"
    FieldColumns(_chunks(50), SCHEMA).write(good)
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(tmp_path / "deflated.npz", "w", zipfile.ZIP_DEFLATED) as out:
        for member in source.infolist():
            out.writestr(member.filename, source.read(member))
    with pytest.raises(IndexLoadError, match="compressed"):
        FieldColumns.read(tmp_path / "deflated.npz", 50, SCHEMA)
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:200])
    with pytest.raises(IndexLoadError, match="not a valid columns file"):
        FieldColumns.read(tmp_path / "cut.npz", 50, SCHEMA)
