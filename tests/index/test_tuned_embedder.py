"""A version that ships a tuned query embedder: loaded with it, served with it (hot reload
included), and refused like a corrupt index file when the model is corrupt, missing, unlisted,
of another dimension or not the one its vectors name. Uses a tiny random BERT (tests/index/tuned_fake.py)."""

from __future__ import annotations

import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from indexer.tune.publish import build_tuned_version, export_tuned
from ragserve.digests import sha256_file
from ragserve.embed.base import Embedder
from ragserve.embed.tuned import TUNED_DIR, TUNED_ONNX, tuned_model_id
from ragserve.errors import IndexLoadError
from ragserve.factory import VersionBuilder, assemble_pipeline
from ragserve.index.format import MANIFEST, latest_version, publish, resolve_current
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from ragserve.index.shipped import fitted_weight
from ragserve.request.serving import ServingVersion
from ragserve.server.convert import info_response_pb
from tests.fakes import FakeEmbedder
from tests.index.tiny import DIM, publish_tiny
from tests.index.tuned_fake import TINY_TEXTS, save_fake_tuned_model

TEXTS = TINY_TEXTS[:5]


@pytest.fixture(scope="module")
def fake_models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Two fake tuned models: 32-dim and 16-dim."""
    base = tmp_path_factory.mktemp("fake-tuned")
    return {dim: save_fake_tuned_model(base / f"tiny{dim}", hidden=dim) for dim in (32, 16)}


def publish_tuned(root: Path, model: Path) -> Path:
    current = HnswIndex.load(root)
    build, manifest = build_tuned_version(root, current, model, "fake-base", progress=False)
    final = replace(manifest, version=latest_version(root) + 1, tuning={"fusion_dense_weight": 0.5})
    return publish(root, build, final)


@pytest.fixture
def tuned_root(tmp_path: Path, fake_models: dict[int, Path]) -> Path:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS, bm25=True)
    publish_tuned(root, fake_models[32])
    return root


def _edit_manifest(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = resolve_current(root) / MANIFEST
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def load_version(root: Path, configured: Embedder | None = None) -> ServingVersion:
    """The published version as the server loads it: index files, then the models it ships."""
    builder = VersionBuilder(configured or FakeEmbedder(dim=DIM), None, RetrievalOptions(), embedder_threads=1)
    return builder(HnswIndex.load(root))


def test_tuned_version_loads_with_its_own_embedder_and_searches(tuned_root: Path) -> None:
    configured = FakeEmbedder(dim=DIM)
    serving = load_version(tuned_root, configured)  # compatible: the version's own model, not the configured one
    index = serving.index
    assert serving.embedder is not configured
    assert index.dim == 32 and serving.embedder.dim == 32
    assert index.embedder_id == tuned_model_id("fake-base", index.manifest.files[TUNED_ONNX])
    assert serving.embedder.model_id == index.embedder_id
    assert index.manifest.tuning == {"fusion_dense_weight": 0.5}
    vector = serving.embedder.embed_query(TEXTS[3]).vector
    hits = index.search(vector, 5, 16)
    assert hits[0].chunk.text == TEXTS[3]  # its own text, embedded by the same model, comes first
    assert index.search_lexical("moon tides", 1)[0].chunk.text == TEXTS[3]  # BM25 carried over


def test_version_without_a_tuned_model_keeps_the_configured_embedder(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    configured = FakeEmbedder(dim=DIM)
    serving = load_version(root, configured)
    index = serving.index
    assert serving.embedder is configured
    assert index.manifest.tuned_embedder == {} and index.manifest.tuning == {}


def test_flipped_byte_in_the_tuned_model_is_refused(tuned_root: Path) -> None:
    path = resolve_current(tuned_root) / TUNED_ONNX
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IndexLoadError, match="fails its checksum"):
        load_version(tuned_root)


@pytest.mark.parametrize("name", [TUNED_ONNX, f"{TUNED_DIR}/tokenizer.json", f"{TUNED_DIR}/config.json"])
def test_missing_tuned_model_file_is_refused(tuned_root: Path, name: str) -> None:
    (resolve_current(tuned_root) / name).unlink()
    with pytest.raises(IndexLoadError, match="is missing"):
        load_version(tuned_root)


def test_unlisted_file_in_the_tuned_model_folder_is_refused(tuned_root: Path) -> None:
    (resolve_current(tuned_root) / TUNED_DIR / "added_tokens.json").write_text("{}")
    with pytest.raises(IndexLoadError, match="not listed"):
        load_version(tuned_root)


def _swap_model(root: Path, source: Path, rename_id: bool) -> None:
    """Put another model's ONNX file in place with a matching checksum (and id, if asked)."""
    target = resolve_current(root) / TUNED_ONNX
    shutil.copyfile(source, target)
    digest = sha256_file(target)

    def change(data: dict) -> None:
        data["files"][TUNED_ONNX] = digest
        if rename_id:
            data["embedder_id"] = tuned_model_id("fake-base", digest)

    _edit_manifest(root, change)


def test_tuned_model_of_another_dimension_is_refused(
    tuned_root: Path, fake_models: dict[int, Path], tmp_path: Path
) -> None:
    other = export_tuned(fake_models[16], tmp_path / "other16", 128)
    _swap_model(tuned_root, other, rename_id=True)  # consistent checksums and id, wrong width
    with pytest.raises(IndexLoadError, match="16-dim vectors"):
        load_version(tuned_root)


def test_tuned_model_that_is_not_the_one_its_vectors_name_is_refused(
    tuned_root: Path, fake_models: dict[int, Path], tmp_path: Path
) -> None:
    other = export_tuned(fake_models[32], tmp_path / "other32", 128)
    data = bytearray(other.read_bytes())
    other.write_bytes(bytes(data) + b"\x00")  # another file (valid checksum once listed), same shape
    _swap_model(tuned_root, other, rename_id=False)
    with pytest.raises(IndexLoadError, match="does not name its tuned model"):
        load_version(tuned_root)


@pytest.mark.parametrize(
    "spec",
    [{"dir": "embedder"}, {"dir": "../x", "onnx": "../x/m.onnx", "base": "b", "max_seq_length": 1}],
)
def test_malformed_tuned_model_entry_is_refused(tuned_root: Path, spec: dict) -> None:
    _edit_manifest(tuned_root, lambda data: data.__setitem__("tuned_embedder", spec))
    with pytest.raises(IndexLoadError):
        load_version(tuned_root)


def test_hot_reload_swaps_the_embedder_with_the_version_and_refuses_a_corrupt_model(
    tmp_path: Path, fake_models: dict[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    executor = ThreadPoolExecutor(1)
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS, bm25=True)
    configured = FakeEmbedder(dim=DIM)
    versions = VersionBuilder(configured, None, RetrievalOptions(), embedder_threads=1)
    holder = assemble_pipeline(configured, HnswIndex.load(root), None, executor, versions=versions)
    reloader = IndexReloader(FolderWatch(root), holder, clock=lambda: 0.0)
    assert holder.embedder is configured
    publish_tuned(root, fake_models[32])
    assert reloader.check_once()
    tuned = holder.embedder
    # Info names what really serves: the version's own model, not the configured one.
    assert info_response_pb(holder.info(), 70, 0).embedder_model == tuned.model_id != configured.model_id
    assert tuned is not configured and tuned.dim == 32
    assert np.asarray(tuned.embed_queries(["tides"])).shape == (1, 32)
    # The next version ships a corrupt model: refused, the tuned version keeps serving with its model.
    publish_tuned(root, fake_models[32])
    onnx = resolve_current(root) / TUNED_ONNX
    onnx.write_bytes(onnx.read_bytes()[:-10])
    with caplog.at_level(logging.ERROR, logger="ragserve.index.reload"):
        assert not reloader.check_once()
    assert "fails its checksum" in caplog.text and reloader.refused == 1
    assert holder.embedder is tuned
    # Back to a version without a tuned model: the configured embedder serves again.
    publish_tiny(root, TEXTS, seed=3, bm25=True)
    assert reloader.check_once()
    assert holder.embedder is configured


def test_a_tuned_version_is_searched_with_its_fitted_weight_unless_switched_off(tuned_root: Path) -> None:
    index = HnswIndex.load(tuned_root)
    assert fitted_weight(index.folder, index.manifest) == 0.5
    assert load_version(tuned_root).retrieval.dense_weight == 0.5
    assert RetrievalOptions(dense_weight=0.4).for_version(0.5).dense_weight == 0.5
    assert RetrievalOptions(dense_weight=0.4, weight_from_index=False).for_version(0.5).dense_weight == 0.4
    untuned = RetrievalOptions(dense_weight=0.4)
    assert untuned.for_version(None) is untuned  # no fitted weight: the settings, as before


@pytest.mark.parametrize("weight", [1.5, "0.5", True, -0.1])
def test_a_bad_fitted_weight_is_refused(tuned_root: Path, weight: object) -> None:
    _edit_manifest(tuned_root, lambda data: data["tuning"].__setitem__("fusion_dense_weight", weight))
    with pytest.raises(IndexLoadError, match="fusion_dense_weight"):
        load_version(tuned_root)


def test_a_stated_max_length_the_model_cannot_take_is_refused_at_load(tuned_root: Path) -> None:
    """The version says its model takes 2,048 tokens; its graph has 512 positions. Found at load
    (one full-length input), not as INTERNAL on the first long query."""
    config = resolve_current(tuned_root) / TUNED_DIR / "sentence_bert_config.json"
    config.write_text(json.dumps({"max_seq_length": 2048}))
    digest = sha256_file(config)
    _edit_manifest(tuned_root, lambda data: data["files"].__setitem__(f"{TUNED_DIR}/sentence_bert_config.json", digest))
    with pytest.raises(IndexLoadError, match="cannot be loaded"):
        load_version(tuned_root)


def test_an_oversized_model_file_is_refused_before_it_is_opened(
    tuned_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragserve.pretrained

    monkeypatch.setattr(ragserve.pretrained, "MAX_MODEL_FILE_BYTES", 1024)
    with pytest.raises(IndexLoadError, match="more than the 1024"):
        load_version(tuned_root)
